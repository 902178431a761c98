"""The ctypes declarations of each kernel library (kernels.library.KERNELS, BLOCKS) match the C
functions its file exports: the same functions, argument counts and types, and return types. A mismatch
would not fail to load; it would pass garbage to the kernels."""

from __future__ import annotations

import ctypes
import re

import pytest

from parrot.engine.kernels.library import BLOCKS, KERNELS, Source

C_TO_CTYPES: dict[str, type | None] = {
    "void": None,
    "int": ctypes.c_int,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
}
# An exported definition: a return type at the start of a line, a parrot_ name, its parameters.
DEFINITION = re.compile(r"^(void|int|int64_t|float)\s+(parrot_\w+)\s*\(([^)]*)\)\s*\{", re.MULTILINE)


def ctype_of(param: str) -> type:
    """One C parameter ("const uint16_t* x", "int64_t N", "float eps") -> its ctypes type."""
    if "*" in param:
        return ctypes.c_void_p
    c_type = " ".join(param.replace("const ", "").split()[:-1])
    ctype = C_TO_CTYPES[c_type]
    assert ctype is not None, f"parameter {param!r} of type void"
    return ctype


def c_signatures(source: Source = KERNELS) -> dict[str, tuple[type | None, list[type]]]:
    found = {}
    for ret, name, params in DEFINITION.findall(source.path.read_text()):
        params = params.strip()
        args = [] if params in ("", "void") else [ctype_of(p) for p in params.split(",")]
        found[name] = (C_TO_CTYPES[ret], args)
    return found


def test_the_parser_reads_the_c_file() -> None:
    sigs = c_signatures()
    assert sigs["parrot_amx_init"] == (ctypes.c_int, [])
    assert sigs["parrot_silu_mul"] == (
        None,
        [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int],
    )


@pytest.mark.parametrize("source", [KERNELS, BLOCKS], ids=lambda s: s.path.name)
def test_ctypes_declarations_match_the_c_signatures(source: Source) -> None:
    sigs = c_signatures(source)
    assert sorted(source.signatures) == sorted(sigs)  # every export declared, nothing declared that is not
    for name, (restype, argtypes) in source.signatures.items():
        c_restype, c_argtypes = sigs[name]
        assert restype == c_restype, f"{name}: restype {restype} but C returns {c_restype}"
        assert len(argtypes) == len(c_argtypes), f"{name}: {len(argtypes)} argtypes, C takes {len(c_argtypes)}"
        for i, (ours, theirs) in enumerate(zip(argtypes, c_argtypes, strict=True)):
            assert ours == theirs, f"{name} argument {i}: ctypes {ours.__name__}, C {theirs.__name__}"


@pytest.mark.parametrize("source", [KERNELS, BLOCKS], ids=lambda s: s.path.name)
def test_a_build_is_keyed_by_every_header_its_file_includes(source: Source) -> None:
    """The shared C code (csrc/) is part of what a cached library is keyed by: a change to a header
    must rebuild both libraries, not load a stale one."""
    pending, seen = [source.path], set()
    while pending:  # the file's local includes, and theirs
        path = pending.pop()
        for name in re.findall(r'^#include "([^"]+)"', path.read_text(), re.MULTILINE):
            header = (path.parent / name).resolve()
            if header not in seen:
                seen.add(header)
                pending.append(header)
    assert {p.name for p in seen} >= {"vec_avx512.h" if source is KERNELS else "vec_avx2.h", "exp.h", "cascade.h"}
    text = source.text()
    for header in seen:
        assert header.read_bytes() in text, f"{header.name} is not in {source.path.name}'s build key"
