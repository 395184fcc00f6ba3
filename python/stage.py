#!/usr/bin/env python3
"""Stages an installable copy of the kvtier package with the build's binaries.

    python3 python/stage.py --build build --out build/python-package
    pip install --no-deps --no-build-isolation build/python-package

copies pyproject.toml and kvtier/ into --out (replacing it), then
libkvtier.so (the file behind the symlinks) into kvtier/libkvtier.so and
kvtierd into kvtier/bin/kvtierd, so the installed package loads its own
library and can start a private daemon (kvtier.Daemon) without a build tree.
The source tree is never written. Exits non-zero naming what is missing.
"""

import argparse
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True, help="the CMake build folder")
    ap.add_argument("--out", required=True, help="folder to (re)create")
    args = ap.parse_args()
    lib = os.path.join(args.build, "client", "libkvtier.so")
    daemon = os.path.join(args.build, "daemon", "kvtierd")
    for path in (lib, daemon):
        if not os.path.exists(path):
            print(f"stage.py: {path} does not exist; build it first", file=sys.stderr)
            return 1
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)
    shutil.copy2(os.path.join(HERE, "pyproject.toml"), args.out)
    shutil.copytree(os.path.join(HERE, "kvtier"), os.path.join(args.out, "kvtier"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "bin"))
    shutil.copy2(os.path.realpath(lib), os.path.join(args.out, "kvtier", "libkvtier.so"))
    os.makedirs(os.path.join(args.out, "kvtier", "bin"))
    shutil.copy2(os.path.realpath(daemon), os.path.join(args.out, "kvtier", "bin", "kvtierd"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
