"""One engine's part in test_vllm_tenants.py's two-user test, run as a child
process that the test starts as another user (so kvtierd sees that user's
SO_PEERCRED and the kernel applies that user's file permissions):

    python tenant_actor.py '{"op": ..., ...}'   # prints one JSON line

Ops (each builds the connector's vLLM-free halves from "extra",
kv_connector_extra_config, and "name", the engine's namespace):
  store   a request of 3 full blocks with cache salt "salt" is stored by a
          scheduler and worker, then looked up by a fresh scheduler:
          {"stored": [[req, first, n]], "hit": tokens, "acl": {ns: entry},
           "warnings": [messages]}
  lookup  a scheduler attaches every namespace of its map and looks the same
          request up: {"hit": tokens, "namespace": routed} or, when the
          daemon refuses, {"error": class name, "message": str}
  open    opens each of "paths" read-write: {"errno": [n per path]}

Errors other than the daemon's refusals end the process non-zero. Needs
neither torch nor pytest (see HostBuffer).
"""

import ctypes
import dataclasses
import errno
import hashlib
import json
import logging
import os
import random
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from kvtier.vllm.config import ConnectorConfig  # noqa: E402
from kvtier.vllm.layout import (CacheDescription, Group,  # noqa: E402
                                NamespaceIdentity, Placement, namespace_layout)
from kvtier.vllm import link  # noqa: E402
from kvtier.vllm.scheduler import KvtierScheduler  # noqa: E402

BS = 16  # tokens per block
PAGE = 2 * BS * 2 * 64 * 2  # K+V, 16 tokens, 2 heads, dim 64, bf16
BLOCKS = 16
IDENTITY = NamespaceIdentity("tiny", "", "c0ffee" * 10, "bfloat16", "auto", BS, 1, 1,
                             "sha256")


def attention_cache() -> CacheDescription:
    """Two layers, each one's blocks contiguous (as test_vllm_worker's)."""
    layers = ("l0", "l1")
    return CacheDescription(BLOCKS, (Placement(layers, PAGE * BLOCKS, PAGE, PAGE),),
                            (Group("attention", BS, layers),), BS, "bfloat16")


class HostBuffer:
    """A CPU buffer with what the worker reads of a torch tensor (numel,
    element_size, data_ptr, device), so that this process needs no torch:
    it may run under any Python the user can execute."""
    device = types.SimpleNamespace(type="cpu", index=None)

    def __init__(self, nbytes: int, seed: int):
        self.raw = (ctypes.c_uint64 * ((nbytes + 7) // 8))()
        data = random.Random(seed).randbytes(nbytes)
        ctypes.memmove(self.raw, data, nbytes)
        self.nbytes = nbytes

    def numel(self) -> int:
        return self.nbytes

    def element_size(self) -> int:
        return 1

    def data_ptr(self) -> int:
        return ctypes.addressof(self.raw)


@dataclasses.dataclass
class SaltedRequest:
    """What the scheduler half reads of a vLLM Request, with its cache salt,
    which (as in vLLM) is inside its block hashes: the same prompt under
    two salts hashes apart."""
    request_id: str
    tokens: list
    cache_salt: str | None = None

    @property
    def num_tokens(self):
        return len(self.tokens)

    @property
    def all_token_ids(self):
        return self.tokens

    @property
    def block_hashes(self):
        h = hashlib.sha256(b"seed" + (self.cache_salt or "").encode()).digest()
        out = []
        for i in range(len(self.tokens) // BS):
            h = hashlib.sha256(h + bytes(str(self.tokens[i * BS:(i + 1) * BS]),
                                         "ascii")).digest()
            out.append(h)
        return out


class _Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _parts(cmd):
    cache = attention_cache()
    cfg = ConnectorConfig.parse(cmd["extra"])
    return cfg, namespace_layout(cache, IDENTITY, 32), cache


def store(cmd):
    from kvtier.vllm.worker import KvtierWorker
    warnings = _Warnings()
    logging.getLogger("kvtier.vllm").addHandler(warnings)
    cfg, layout, cache = _parts(cmd)
    name = cmd["name"]
    sched = KvtierScheduler(cfg, name, layout, cache)
    sched.worker_ready = sched.link.attach_all()
    worker = KvtierWorker(cfg, name, layout, cache)
    worker.register(HostBuffer(2 * BLOCKS * PAGE, cmd.get("seed", 1)))
    req = SaltedRequest("w1", list(range(3 * BS + 1)), cmd.get("salt"))
    sched.matched_tokens(req, 0)
    worker.store([sched.plan_store(req.request_id, 3 * BS, ([1, 2, 3, 4],))])
    report = worker.poll()
    sched.on_report(report)
    fresh = KvtierScheduler(cfg, name, layout, cache)
    fresh.worker_ready = fresh.link.attach_all()
    hit = fresh.matched_tokens(SaltedRequest("r1", req.tokens, req.cache_salt), 0)
    acl = {n: sched.link.namespace(n).acl_entry for n in sched.link.names}
    for x in (fresh, worker, sched):
        x.close()
    return {"stored": report.stored, "hit": hit, "acl": acl,
            "warnings": warnings.messages}


def lookup(cmd):
    cfg, layout, cache = _parts(cmd)
    sched = KvtierScheduler(cfg, cmd["name"], layout, cache)
    try:
        sched.worker_ready = sched.link.attach_all()
    except link.AttachRefused as e:
        return {"error": type(e).__name__, "message": str(e)}
    req = SaltedRequest("l1", list(range(3 * BS + 1)), cmd.get("salt"))
    hit = sched.matched_tokens(req, 0)
    routed = sched.tenants.route(req.cache_salt)
    sched.close()
    return {"hit": hit, "namespace": routed}


def open_paths(cmd):
    out = []
    for path in cmd["paths"]:
        try:
            os.close(os.open(path, os.O_RDWR))
            out.append(0)
        except OSError as e:
            out.append(e.errno or errno.EIO)
    return {"errno": out}


def main():
    cmd = json.loads(sys.argv[1])
    op = {"store": store, "lookup": lookup, "open": open_paths}[cmd["op"]]
    print(json.dumps(op(cmd)))


if __name__ == "__main__":
    main()
