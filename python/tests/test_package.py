"""The package installs with pip from the build (python/stage.py bundles
libkvtier.so and kvtierd) and then works with no build tree and no
environment variables: it loads its own library and starts its own daemon.
Every package and module of the source tree is in the installed copy and
imports from it (pyproject.toml's package list cannot drift).

Thread-safety: pytest runs these tests in one thread."""

import ast
import json
import os
import subprocess
import sys

import pytest

PY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_dir():
    lib = os.environ.get("KVTIER_LIB")
    if not lib:
        pytest.skip("KVTIER_LIB is not set: no build to stage from")
    return os.path.dirname(os.path.dirname(os.path.abspath(lib)))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A folder the staged package is pip-installed into (--target)."""
    tmp = tmp_path_factory.mktemp("install")
    staged, site = tmp / "pkg", tmp / "site"
    subprocess.run([sys.executable, os.path.join(PY_ROOT, "stage.py"),
                    "--build", build_dir(), "--out", str(staged)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(site),
                    str(staged)], check=True)
    return site


def installed_env(site) -> dict:
    """The environment of a child that sees the installed copy only: no
    build tree, no source tree."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVTIER_LIB", "KVTIERD", "KVT_BIN", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    return env


def test_pip_install_from_the_build_bundles_library_and_daemon(site, tmp_path):
    code = """
import torch, kvtier
print(kvtier.library_path())
print(kvtier.find_kvtierd())
with kvtier.Daemon() as d, kvtier.Client(socket=d.socket) as c:
    k = [torch.arange(4 * 64, dtype=torch.float32).view(4, 64)]
    pool = kvtier.TorchPool({"kv": k})
    ns = c.attach("pip", pool.layout(tokens_per_page=2, num_layers=1), page_rows=8)
    res = ns.reserve(1)
    ns.transfer(pool).evict([2], res.page_rows)
    res.commit(ns.hash_tokens([7, 8]))
    with ns.lookup(ns.hash_tokens([7, 8, 9])) as lease:
        print(lease.usable_pages)
"""
    r = subprocess.run([sys.executable, "-c", code], env=installed_env(site),
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lib, daemon, usable = r.stdout.split()
    assert lib == str(site / "kvtier" / "libkvtier.so")
    assert daemon == str(site / "kvtier" / "bin" / "kvtierd")
    assert usable == "1"


def source_modules() -> dict[str, dict]:
    """{dotted name: {"package": an __init__.py, "vllm": its module level
    imports vllm}} of every package (a folder with an __init__.py) and
    module under python/kvtier, found by walking the source tree, not by
    asking the package."""
    out = {}
    root = os.path.join(PY_ROOT, "kvtier")
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs
                         if os.path.exists(os.path.join(folder, d, "__init__.py")))
        prefix = os.path.relpath(folder, PY_ROOT).replace(os.sep, ".")
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            with open(os.path.join(folder, f), encoding="utf-8") as src:
                body = ast.parse(src.read()).body
            names = [a.name for n in body if isinstance(n, ast.Import) for a in n.names]
            names += [n.module for n in body
                      if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module]
            package = f == "__init__.py"
            out[prefix if package else f"{prefix}.{f[:-3]}"] = {
                "package": package,
                "vllm": any(m == "vllm" or m.startswith("vllm.") for m in names)}
    return out


# Imports each module named on the command line; prints one JSON line per
# module: the file it came from, or the error (and the missing module).
IMPORT_EACH = """
import importlib, json, sys
for name in sys.argv[1:]:
    out = {"name": name, "file": None, "missing": None, "error": None}
    try:
        out["file"] = importlib.import_module(name).__file__
    except ModuleNotFoundError as e:
        out["missing"], out["error"] = e.name, repr(e)
    except Exception as e:
        out["error"] = repr(e)
    print(json.dumps(out), flush=True)
"""


def vllm_importable() -> bool:
    r = subprocess.run([sys.executable, "-c", "import vllm.distributed"],
                       capture_output=True)
    return r.returncode == 0


def test_every_package_and_module_of_the_source_tree_imports_installed(site, tmp_path):
    """Each package and module found in python/kvtier imports from the
    installed copy, from the file pip put there. vLLM is neither a
    dependency of the package nor in the plain venv: a module whose module
    level imports vllm (kvtier.vllm.connector) must import where vllm is
    importable, and elsewhere must stop at ModuleNotFoundError for vllm
    itself (its installed file was found and ran up to that import). The
    package kvtier.vllm and its vLLM-free modules import everywhere."""
    modules = source_modules()
    assert {"kvtier", "kvtier.hf", "kvtier.vllm", "kvtier.vllm.connector"} <= set(modules)
    assert modules["kvtier.vllm.connector"]["vllm"] and not modules["kvtier.vllm"]["vllm"]
    r = subprocess.run([sys.executable, "-c", IMPORT_EACH, *modules],
                       env=installed_env(site), cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    results = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["name"] for x in results] == list(modules)
    for x in results:
        name, parts = x["name"], x["name"].split(".")
        missing = x["missing"] or ""
        if modules[name]["vllm"] and (missing == "vllm" or missing.startswith("vllm.")):
            assert not vllm_importable(), f"{name}: {x['error']} with vllm importable"
            assert site.joinpath(*parts[:-1], parts[-1] + ".py").is_file(), name
            continue
        assert x["error"] is None, f"{name}: {x['error']}"
        if modules[name]["package"]:
            expect = site.joinpath(*parts, "__init__.py")
        else:
            expect = site.joinpath(*parts[:-1], parts[-1] + ".py")
        assert x["file"] == str(expect), name


def test_stage_names_what_is_missing(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(PY_ROOT, "stage.py"),
                        "--build", str(tmp_path), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "libkvtier.so does not exist" in r.stderr
