"""vLLM over kvtierd's cluster tier, end to end: two nodes' daemons share a
real Redis Cluster (python/tests/redis_cluster.py) and a key file, both with
--cluster_write_through. A real vLLM (CPU) engine on daemon A computes a
prompt, which daemon A writes through to Redis; an engine on daemon B, with
`kv_connector_extra_config["cluster"]`, is asked the same prompt: its
scheduler answers vLLM 0.32's "ask again later" while daemon B prefetches
the prefix, and the engine is then served it from B's host tier,
bit-identical to engine A's own cached serve.

Without redis-server it skips, unless KVTIER_REQUIRE_REDIS=1 (make test).
"""

import os
import sys
import time

import pytest

from conftest import PROMPT, make_model

import kvtier

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "tests"))
from redis_cluster import key_file  # noqa: E402
from redis_cluster import redis_cluster  # noqa: E402,F401 (a fixture)

FULL_BLOCK_TOKENS = 1024  # 1,100-token prompt, 128-token blocks: 8 full blocks


def gen(prompt=PROMPT, **kw):
    return dict({"op": "generate", "prompt": prompt, "max_tokens": 16,
                 "logprobs": 20}, **kw)


def script(model, socket, steps, **extra):
    return {"arch": "llama", "model": model, "socket": socket, "extra": extra,
            "steps": steps}


def test_a_prefix_from_another_node_is_served_after_ask_again_later(
        redis_cluster, run_engine, tmp_path):  # noqa: F811
    model = make_model("llama")
    key = key_file(tmp_path / "cluster.key")
    flags = ["--default_namespace_bytes=268435456",
             f"--cluster_redis={redis_cluster.seeds}", f"--cluster_key_file={key}",
             "--cluster_write_through"]
    before = redis_cluster.keys()
    with kvtier.Daemon(flags=flags) as a, kvtier.Daemon(flags=flags) as b:
        # Node A: computes the prompt, then serves it from vLLM's own cache.
        first, second = run_engine(script(model, a.socket, [gen(), gen()]))
        assert first["num_cached_tokens"] == 0
        assert second["num_cached_tokens"] >= FULL_BLOCK_TOKENS
        # A's commits reach Redis (one value per page: one rank). Polled by
        # count.
        for _ in range(600):
            if len(redis_cluster.keys() - before) >= 8:
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"daemon A wrote {len(redis_cluster.keys() - before)} "
                        f"values to Redis, not 8")
        # Node B holds nothing; with the switch its engine waits for the
        # prefetch and is served the prefix (1,024 tokens cached, 76
        # computed: engine A's second serve's schedule).
        (served,) = run_engine(script(model, b.socket, [gen()], cluster=True))
        assert served["num_cached_tokens"] >= FULL_BLOCK_TOKENS
        assert served["token_ids"] == second["token_ids"]
        assert served["logprobs"] == second["logprobs"]
