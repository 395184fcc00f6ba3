"""pytest fixtures for the kvtier package: a private kvtierd per test module
and a connected client. The library and daemon come from $KVTIER_LIB and
$KVTIERD (ctest sets both to this build's), else from kvtier's own search.

Thread-safety: pytest runs these tests in one thread.
"""

import os
import sys

import pytest

PY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, PY_ROOT)

import kvtier  # noqa: E402


def child_env(**extra) -> dict:
    """The environment for a child Python process that imports this kvtier."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (PY_ROOT, os.environ.get("PYTHONPATH")) if p)
    return env


@pytest.fixture(scope="module")
def daemon():
    with kvtier.Daemon() as d:
        yield d


@pytest.fixture
def client(daemon):
    with kvtier.Client(socket=daemon.socket, name="pytest") as c:
        yield c
