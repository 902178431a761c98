"""The engine's imports: no cycles among its modules, and the model code imports torch only (its
speed-ups are transforms applied from outside, parrot.engine.kernels)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Collection
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "parrot" / "engine"
TORCH_ONLY = ["model/config.py", "model/layers.py", "model/llama.py", "model/rope.py"]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path, modules: Collection[str] = ()) -> list[str]:
    """Modules imported when `path` is imported: module-level statements, not those inside
    functions (late imports) or under `if TYPE_CHECKING:`. `from a.b import c` imports module
    a.b.c when that is one of `modules`, else a name of a.b. (The parent packages a submodule
    import loads first are not counted: a package that re-exports its submodules is no cycle.)"""
    names: list[str] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                names.extend(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    names.append(sub if sub in modules else node.module)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody)

    visit(ast.parse(path.read_text()).body)
    return names


def engine_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in ENGINE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        graph[name] = {m for m in top_level_imports(path, set(files)) if m in files} - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := dfs(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := dfs(node)) is not None:
            return cycle
    return None


def test_no_import_cycles_in_the_engine() -> None:
    graph = engine_graph()
    assert "parrot.engine.kernels.decode" in graph["parrot.engine.kernels"]  # the graph sees packages
    assert find_cycle(graph) is None


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_model_code_imports_torch_only() -> None:
    bad = []
    for rel in TORCH_ONLY:
        for name in top_level_imports(ENGINE / rel):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top == "torch" or name.startswith("parrot.engine.model"):
                continue
            bad.append(f"{rel} imports {name}")
    assert bad == []


ENTRY = ["parrot.engine.llm_engine", "parrot.engine.async_engine", "parrot.engine.sync_client", "parrot.engine.server"]
# What each folder must not import (module-level or late), as its README says.
FOLDER_FORBIDS = {
    "model": ["parrot.engine.kernels", "parrot.engine.attention", "parrot.engine.kv", "parrot.engine.sched", *ENTRY],
    "kernels": ["parrot.engine.attention", "parrot.engine.kv", "parrot.engine.sched", *ENTRY],
    "attention": ["parrot.engine.model", "parrot.engine.sched", *ENTRY],
    "kv": ["parrot.engine.model", "parrot.engine.kernels", "parrot.engine.attention", "parrot.engine.sched", *ENTRY],
    "sched": ["parrot.engine.model", "parrot.engine.kernels", "parrot.engine.attention", *ENTRY],
}


def all_imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return names


def test_folders_import_what_their_readmes_allow() -> None:
    bad = []
    for folder, forbidden in FOLDER_FORBIDS.items():
        assert (ENGINE / folder / "README.md").exists()
        for path in sorted((ENGINE / folder).rglob("*.py")):
            for name in all_imports(path):
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    bad.append(f"{path.relative_to(ENGINE)} imports {name}")
    assert bad == []
