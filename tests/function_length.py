#!/usr/bin/env python3
"""Fails when a product function is longer than the house style allows.

docs/design.md, "House style": no function over 120 lines in product code,
with no allowlist. Product code is every tracked C, C++, CUDA and Python
source outside the tests: the files under daemon/, client/, cli/, shm/,
common/, kernels/, bench/, fuzz/ and python/kvtier/, without unit tests
(*_test.cc), test fixtures (*test_util*, *_fixture*) and the tests/ and
python/tests*/ folders. CUDA files (.cu, .cuh) are read as C++.

Lengths are lizard's (PyPI, python/requirements.txt): a function's lines
from its signature to its closing brace, comments and blank lines included.

ctest runs it as a pytest test (python/run_tests.sh, the project venv).
By hand: function_length.py SOURCE_DIR [--max 120] prints every function
over the limit (file:line name length) and exits 1 if there is one.
"""
import argparse
import os
import subprocess
import sys

import lizard

PRODUCT_DIRS = ("daemon", "client", "cli", "shm", "common", "kernels",
                "bench", "fuzz", os.path.join("python", "kvtier"))
CPP = (".cc", ".h", ".c", ".cpp", ".hpp")
CUDA = (".cu", ".cuh")


def is_test(path):
    base = os.path.basename(path)
    return (base.endswith("_test.cc") or "test_util" in base or
            "_fixture" in base or base.startswith("test_"))


def product_files(root):
    """Tracked product sources (git ls-files), relative to root."""
    out = subprocess.run(["git", "-C", root, "ls-files", *PRODUCT_DIRS],
                         check=True, capture_output=True, text=True).stdout
    for path in out.splitlines():
        if is_test(path):
            continue
        if path.endswith(CPP + CUDA + (".py",)):
            yield path


def functions(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        code = f.read()
    # lizard picks its reader by the name: CUDA is C++ to it.
    name = path + ".cpp" if path.endswith(CUDA) else path
    info = lizard.analyze_file.analyze_source_code(name, code)
    for fn in info.function_list:
        yield fn


def too_long(root, most):
    """(functions read, [(path, line, name, length) over `most`], longest
    first)."""
    long, seen = [], 0
    for path in product_files(root):
        for fn in functions(root, path):
            seen += 1
            if fn.length > most:
                long.append((path, fn.start_line, fn.long_name, fn.length))
    return seen, sorted(long, key=lambda x: -x[3])


def report(long, seen, most):
    lines = [f"{path}:{line}: {name} is {length} lines (most: {most})"
             for path, line, name, length in long]
    if long:
        lines.append(f"function_length: {len(long)} of {seen} functions are "
                     f"longer than {most} lines: split them along their "
                     f"steps (docs/design.md, House style)")
    else:
        lines.append(f"function_length: {seen} functions, none over {most} "
                     f"lines")
    return "\n".join(lines)


def test_no_product_function_is_over_120_lines():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    seen, long = too_long(root, 120)
    assert seen > 1000, f"read only {seen} functions under {root}"
    assert not long, report(long, seen, 120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--max", type=int, default=120)
    args = parser.parse_args()
    seen, long = too_long(args.root, args.max)
    print(report(long, seen, args.max))
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main())
