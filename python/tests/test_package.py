"""The package installs with pip from the build (python/stage.py bundles
libkvtier.so and kvtierd) and then works with no build tree and no
environment variables: it loads its own library and starts its own daemon."""

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


def test_pip_install_from_the_build_bundles_library_and_daemon(tmp_path):
    staged, site = tmp_path / "pkg", tmp_path / "site"
    subprocess.run([sys.executable, os.path.join(PY_ROOT, "stage.py"),
                    "--build", build_dir(), "--out", str(staged)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(site),
                    str(staged)], check=True)
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
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVTIER_LIB", "KVTIERD", "KVT_BIN", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lib, daemon, usable = r.stdout.split()
    assert lib == str(site / "kvtier" / "libkvtier.so")
    assert daemon == str(site / "kvtier" / "bin" / "kvtierd")
    assert usable == "1"


def test_stage_names_what_is_missing(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(PY_ROOT, "stage.py"),
                        "--build", str(tmp_path), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "libkvtier.so does not exist" in r.stderr
