"""The tree's shape, checked: imports go one way between layers and folders, no module takes part in
an import cycle (type-only and function-level imports included), benchmarks use public APIs only,
and no file is squeezed to fit a size (files are sized by concept: no `# fmt: skip`)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "parrot"

ENGINE_ENTRY = (
    "parrot.engine.llm_engine",
    "parrot.engine.async_engine",
    "parrot.engine.sync_client",
    "parrot.engine.server",
)
# Folder (relative to parrot/) -> import prefixes it must not use. The most specific folder applies
# together with every enclosing one.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "protocol": ("parrot.", "torch", "fastapi", "httpx"),
    "text": ("parrot.engine", "parrot.serve", "parrot.frontend", "parrot.backends", "parrot.web", "torch"),
    "frontend": ("parrot.engine", "parrot.serve", "parrot.text", "parrot.backends", "parrot.web", "torch"),
    "web": ("parrot.engine", "parrot.serve", "parrot.frontend", "parrot.backends", "parrot.text", "torch"),
    "backends": ("parrot.engine", "parrot.serve", "parrot.frontend", "torch", "transformers"),
    "serve": ("parrot.engine", "parrot.frontend", "parrot.backends", "torch", "transformers"),
    # Integrations are SDK users: the client SDK and the protocol, nothing of the servers.
    "integrations": (
        "parrot.engine",
        "parrot.serve",
        "parrot.backends",
        "parrot.web",
        "parrot.text",
        "parrot.launch",
        "parrot.cli",
        "torch",
    ),
    # Policies are pure planning: they never reach into runtime state, the HTTP layer or the manager.
    "serve/policy": ("parrot.serve.runtime", "parrot.serve.http", "parrot.serve.manager", "parrot.text", "fastapi"),
    "serve/runtime": ("parrot.serve.http", "parrot.serve.manager", "fastapi"),
    "engine": ("parrot.serve", "parrot.frontend", "parrot.backends"),
    # The simulator drives the real manager over the engine contract: never the builtin engine,
    # beside its pure step planning (PURE_PLANNING, allowed below).
    "sim": (
        "parrot.engine",
        "parrot.frontend",
        "parrot.backends",
        "parrot.launch",
        "parrot.cli",
        "torch",
        "transformers",
    ),
    # Engine folders as their READMEs say. The model imports torch only: native kernels are a
    # transform applied to a loaded model from outside (parrot.engine.kernels.apply_native).
    "engine/model": (
        "parrot.engine.kernels",
        "parrot.engine.attention",
        "parrot.engine.kv",
        "parrot.engine.sched",
        "parrot.text",
        *ENGINE_ENTRY,
    ),
    "engine/kernels": ("parrot.engine.attention", "parrot.engine.kv", "parrot.engine.sched", *ENGINE_ENTRY),
    "engine/attention": ("parrot.engine.model", "parrot.engine.sched", *ENGINE_ENTRY),
    "engine/kv": (
        "parrot.engine.model",
        "parrot.engine.kernels",
        "parrot.engine.attention",
        "parrot.engine.sched",
        *ENGINE_ENTRY,
    ),
    "engine/sched": ("parrot.engine.model", "parrot.engine.kernels", "parrot.engine.attention", *ENGINE_ENTRY),
}
# The model code proper: torch, the standard library and its own folder, nothing else.
TORCH_ONLY = ("engine/model/config.py", "engine/model/layers.py", "engine/model/llama.py", "engine/model/rope.py")
# The engine's step planning without torch or engine state: the simulator plans with it too.
PURE_PLANNING = ("parrot.engine.sched.plan", "parrot.engine.sched.policy")
ALLOWED = {"protocol": ("parrot.protocol",), "sim": PURE_PLANNING}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imports_of(path: Path) -> list[str]:
    """Every absolute module name `path` imports, anywhere in the file (also under TYPE_CHECKING
    and inside functions); `from a import b` counts as `a.b` when that is a module."""
    names: list[str] = []
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for a in node.names:
                full = f"{base}.{a.name}"
                names.append(full if full in MODULES else base)
    return names


def project_target(name: str) -> str | None:
    """The project module an import name resolves to (the longest module prefix), or None."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def rules_for(path: Path) -> list[str]:
    rel = path.relative_to(ROOT).parent.as_posix()
    return [folder for folder in FORBIDDEN if rel == folder or rel.startswith(folder + "/")]


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_imports_go_one_way(folder: str) -> None:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"no files in parrot/{folder}"
    bad = []
    for f in files:
        for rule in rules_for(f):
            for name in imports_of(f):
                if any(name == a or name.startswith(a + ".") for a in ALLOWED.get(rule, ())):
                    continue
                if any(
                    name == p.rstrip(".") or name.startswith(p if p.endswith(".") else p + ".") or name == p
                    for p in FORBIDDEN[rule]
                ):
                    bad.append(f"{f.relative_to(ROOT)} imports {name} ({rule} must not)")
    assert bad == []


def test_model_code_imports_torch_only() -> None:
    bad = []
    for rel in TORCH_ONLY:
        for name in imports_of(ROOT / rel):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top == "torch" or name.startswith("parrot.engine.model"):
                continue
            bad.append(f"{rel} imports {name}")
    assert bad == []


def test_pure_planning_imports_the_standard_library_protocol_and_itself_only() -> None:
    bad = []
    for module in PURE_PLANNING:
        for name in imports_of(MODULES[module]):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or name.startswith("parrot.protocol") or name in PURE_PLANNING:
                continue
            bad.append(f"{module} imports {name}")
    assert bad == []


def test_pure_planning_loads_where_torch_cannot() -> None:
    """Imported in a fresh interpreter where any import of torch fails: the modules load (their
    packages' __init__ included) and torch stays out."""
    code = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        f"import {', '.join(PURE_PLANNING)}\n"
        "import parrot.sim.engine\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert [out.returncode, out.stdout.strip(), out.stderr] == [0, "[]", ""]


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return cycles


def test_import_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = {project_target(i) for i in imports_of(path)}
        graph[name] = {t for t in targets if t is not None and t != name}
    assert import_cycles(graph) == []


def test_benchmarks_use_public_apis_only() -> None:
    """No private name of the project imported, and no `x._private` reached into (own `self` aside)."""
    bad = []
    for path in sorted((REPO / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("parrot"):
                bad += [f"{where} imports {a.name}" for a in node.names if a.name.startswith("_")]
                if any(p.startswith("_") and p != "__init__" for p in (node.module or "").split(".")):
                    bad.append(f"{where} imports {node.module}")
            elif (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                bad.append(f"{where} reaches {ast.unparse(node)}")
    assert bad == []


def test_no_file_is_squeezed_to_a_size() -> None:
    """The formatter decides the layout; a file too long for its concepts is split, not squeezed."""
    squeezed = []
    for folder in ("parrot", "tests", "benchmarks", "examples", "scripts"):
        for path in (REPO / folder).rglob("*.py"):
            if path == Path(__file__).resolve():
                continue  # this test names the markers it looks for
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if "fmt: skip" in line or "fmt: off" in line:
                    squeezed.append(f"{path.relative_to(REPO)}:{i}")
    assert squeezed == []


def test_every_folder_has_a_readme() -> None:
    folders = sorted({p.parent for p in ROOT.rglob("*.py")})
    missing = [f.relative_to(REPO).as_posix() for f in folders if not (f / "README.md").is_file()]
    assert missing == []


def test_every_folder_readme_names_what_it_owns_and_its_imports() -> None:
    """Each package README says what the folder owns and what it may or must not import."""
    folders = sorted({p.parent for p in ROOT.rglob("*.py")})
    vague = []
    for folder in folders:
        text = (folder / "README.md").read_text().lower()
        if "owns" not in text or "import" not in text:
            vague.append(folder.relative_to(REPO).as_posix())
    assert vague == []
