"""Fixtures of the vLLM suite (ctest label `vllm`): a private kvtierd, tiny
model folders, and engines run as real processes (engine.py) with the vLLM
venv's Python. Runs only where vLLM is installed (make vllm-deps).

Thread-safety: pytest runs these tests in one thread.
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PY_ROOT = os.path.dirname(HERE)
sys.path.insert(0, PY_ROOT)

import kvtier  # noqa: E402

from models import CONFIGS, PROMPT, make_model  # noqa: E402,F401


def engine_env(**extra) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
               **extra)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (PY_ROOT, os.environ.get("PYTHONPATH")) if p)
    return env


class Engine:
    """One engine.py process."""

    def __init__(self, tmp, script: dict, env: dict | None = None):
        fd, path = tempfile.mkstemp(suffix=".json", dir=tmp)
        with os.fdopen(fd, "w") as f:
            json.dump(script, f)
        self.log_path = path + ".log"
        self.out_path = path + ".out"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "engine.py"), path, self.out_path],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=engine_env(**(env or {})))

    def results(self, timeout: float = 600) -> list[dict]:
        """Waits for the engine to exit; its per-step results (the "ready"
        line dropped). Fails the test with the log tail on a bad exit."""
        self.proc.wait(timeout=timeout)
        self._log.close()
        if self.proc.returncode != 0:
            tail = open(self.log_path).read()[-6000:]
            pytest.fail(f"engine exited {self.proc.returncode}:\n{tail}")
        with open(self.out_path) as f:
            lines = [json.loads(l) for l in f if l.strip()]
        return [l for l in lines if l.get("op") != "ready"]

    def log(self) -> str:
        return open(self.log_path).read()


@pytest.fixture
def run_engine(tmp_path):
    def run(script, env=None):
        return Engine(str(tmp_path), script, env).results()
    return run


@pytest.fixture
def start_engine(tmp_path):
    engines = []

    def start(script, env=None):
        e = Engine(str(tmp_path), script, env)
        engines.append(e)
        return e
    yield start
    for e in engines:
        if e.proc.poll() is None:
            e.proc.kill()
            e.proc.wait()


@pytest.fixture(scope="module")
def daemon():
    with kvtier.Daemon(flags=["--default_namespace_bytes=268435456"]) as d:
        yield d


def ctl_json(socket: str, command: str):
    """`kvtierctl --json COMMAND` of the daemon at `socket`, parsed."""
    ctl = os.environ.get("KVTIERCTL") or os.path.join(
        os.path.dirname(kvtier.find_kvtierd()), "..", "cli", "kvtierctl")
    out = subprocess.run([ctl, f"--socket={socket}", "--json", command],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def namespaces(socket: str) -> list[dict]:
    """`kvtierctl --json namespaces` of the daemon at `socket`."""
    data = ctl_json(socket, "namespaces")
    return data["namespaces"] if isinstance(data, dict) else data
