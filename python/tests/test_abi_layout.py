"""The ctypes declarations of python/kvtier/_lib.py against the C header
they mirror by hand (client/include/kvtier/kvtier.h): every struct's size,
alignment and each field's name, order, offset and size as the C compiler
lays them out (kvtier_abi_layout, built as C), the status codes and enum
values, and every kvt_* function the header declares, with its argument
count."""

import ctypes
import glob
import json
import os
import re
import subprocess

import pytest

from kvtier import _lib, errors

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(REPO, "client", "include", "kvtier", "kvtier.h")


def layout_program() -> str:
    path = os.environ.get("KVTIER_ABI_LAYOUT")
    if path:
        return path
    found = sorted(glob.glob(os.path.join(REPO, "build*", "client",
                                          "kvtier_abi_layout")),
                   key=os.path.getmtime, reverse=True)
    if not found:
        pytest.skip("kvtier_abi_layout is not built (set KVTIER_ABI_LAYOUT)")
    return found[0]


@pytest.fixture(scope="module")
def c_layout():
    out = subprocess.run([layout_program()], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def test_every_struct_matches_the_header(c_layout):
    assert c_layout["api_version"] == _lib.API_VERSION
    assert set(c_layout["structs"]) == set(_lib.STRUCTS), \
        "a struct of kvtier.h has no ctypes twin in _lib.STRUCTS, or the reverse"
    for name, c in c_layout["structs"].items():
        py = _lib.STRUCTS[name]
        assert ctypes.sizeof(py) == c["size"], name
        assert ctypes.alignment(py) == c["align"], name
        py_fields = [f[0] for f in py._fields_]
        assert py_fields == list(c["fields"]), f"{name}: field names or order"
        for field, (offset, size) in c["fields"].items():
            descr = getattr(py, field)
            assert (descr.offset, descr.size) == (offset, size), f"{name}.{field}"


def test_constants_match_the_header(c_layout):
    k = c_layout["constants"]
    assert c_layout["enum_size"] == ctypes.sizeof(ctypes.c_int32)
    statuses = {v: n[len("KVT_"):] for n, v in k.items()
                if n.startswith("KVT_") and not n.startswith(("KVT_HASH_", "KVT_BACKEND_"))}
    assert statuses == errors.CODE_NAMES
    assert (k["KVT_HASH_SHA256"], k["KVT_HASH_XXH3_128"]) == \
        (_lib.HASH_SHA256, _lib.HASH_XXH3_128)
    assert (k["KVT_BACKEND_CUDA"], k["KVT_BACKEND_REFERENCE"]) == \
        (_lib.BACKEND_CUDA, _lib.BACKEND_REFERENCE)


def header_functions() -> dict[str, int]:
    """kvt_* function declarations of kvtier.h: name -> argument count."""
    text = open(HEADER).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"^\s*#.*$", " ", text, flags=re.M)
    out = {}
    for m in re.finditer(r"\b(kvt_[a-z0-9_]+)\s*\(([^;{}()]*)\)\s*;", text):
        args = m.group(2).strip()
        out[m.group(1)] = 0 if args in ("", "void") else args.count(",") + 1
    return out


def test_every_header_function_is_declared_with_its_arity():
    declared = header_functions()
    assert len(declared) > 60  # the parser found the header's functions
    assert set(declared) == set(_lib._SIGNATURES), (
        f"in kvtier.h only: {sorted(set(declared) - set(_lib._SIGNATURES))}; "
        f"in _lib only: {sorted(set(_lib._SIGNATURES) - set(declared))}")
    for name, n in declared.items():
        assert len(_lib._SIGNATURES[name][1]) == n, name
    lib = _lib.load()
    for name in declared:
        assert getattr(lib, name).argtypes is not None, name
