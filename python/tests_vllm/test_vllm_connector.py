"""vLLM on kvtier, end to end: real vLLM (CPU) engines with the kvtier
connector, each its own process, against a real kvtierd.

What a user relies on: a prefix one engine computed is served to another
engine of the node (a restarted one, or a sibling running at the same
time) bit-identical, hybrid models included; other tenants (cache_salt) and
a changed model config never hit; a tenant mapped to a namespace of its own
(tenant_namespaces) is stored there and served from there; the check can see wrong KV (a test-only
fault corrupts one loaded block); a daemon that is down or dies never
stops vLLM from serving.
"""

import concurrent.futures
import json
import os
import shutil
import signal
import time

import pytest

from conftest import PROMPT, ctl_json, make_model, namespaces

import kvtier

FULL_BLOCK_TOKENS = 1024  # 1,100-token prompt, 128-token blocks: 8 full blocks


def gen(prompt=PROMPT, **kw):
    return dict({"op": "generate", "prompt": prompt, "max_tokens": 16,
                 "logprobs": 20}, **kw)


def script(arch, model, socket, steps, **extra):
    return {"arch": arch, "model": model, "socket": socket, "extra": extra,
            "steps": steps}


def only_ns(socket, model):
    """The daemon's namespaces of vLLM engines serving `model`."""
    return [n for n in namespaces(socket) if n["name"].startswith("vllm-")
            and n["layout"]["model"].startswith(model + "@")]


# Two shapes at a time: each runs in a thread of its own, which only starts
# engine processes and waits for them, so one shape's engine starts (mostly
# one core of Python) overlap the other's prefills. Each shape has its own
# model, namespaces and files.
SHAPE_PAIRS = [("llama", "qwen3_next_8"), ("qwen3_next", "gemma3")]


@pytest.mark.parametrize("archs", SHAPE_PAIRS, ids="+".join)
def test_restarted_engine_is_served_bit_identical(archs, daemon, run_engine,
                                                  start_engine, tmp_path, capsys):
    # The models first, in this thread: make_model seeds torch's global RNG.
    models = [make_model(arch) for arch in archs]
    with concurrent.futures.ThreadPoolExecutor(len(archs)) as pool:
        runs = [pool.submit(restart_checks, arch, model, daemon, run_engine,
                            start_engine, tmp_path / arch)
                for arch, model in zip(archs, models)]
        hits = [r.result() for r in runs]  # Raises what a shape's check raised.
    with capsys.disabled():  # the hits side by side, in the test's output
        for line in hits:
            print(line)


def restart_checks(arch, model, daemon, run_engine, start_engine, tmp_path):
    """One shape's restart, tenant, abort, corrupt-load and changed-config
    checks on `model` (a folder make_model made); returns the line comparing
    its hits with vLLM's own cache."""
    tmp_path.mkdir()
    # Process 1: serves the prompt, then again from vLLM's own prefix cache.
    first, second = run_engine(script(arch, model, daemon.socket, [gen(), gen()]))
    assert first["num_cached_tokens"] == 0
    assert second["num_cached_tokens"] >= FULL_BLOCK_TOKENS
    ns = only_ns(daemon.socket, model)
    assert len(ns) == 1 and int(ns[0]["pages"]) >= 8
    if arch.startswith("qwen3_next"):
        assert int(ns[0]["snapshots"]) >= 1
        groups = 3 if arch == "qwen3_next_8" else 1
        row = int(ns[0]["layout"]["page_banks"][0]["row_bytes"])
        assert int(ns[0]["layout"]["snapshot_row_bytes"]) == groups * row
    if arch == "gemma3":  # a page row: the full-attention and 3 window blocks
        row = int(ns[0]["layout"]["page_banks"][0]["row_bytes"])
        assert row == 4 * 2 * 128 * 2 * 32 * 2, ns[0]["layout"]

    # Process 2, same config: the prompt comes from kvtier, and the top-20
    # logprobs of 16 tokens equal process 1's second serve (same schedule:
    # 1,024 tokens cached, 76 computed). Another tenant's salt gets nothing,
    # and that tenant, mapped to a namespace of its own, is stored there;
    # aborted requests leave no pins.
    aborted, checked = str(tmp_path / "aborted"), str(tmp_path / "checked")
    tenants = {"tenant_namespaces": {"tenant-b": "tb"}}
    e = start_engine(script(arch, model, daemon.socket, [
        gen(), gen(cache_salt="tenant-b"),
        {"op": "abort_many", "prompt": PROMPT, "count": 12},
        {"op": "touch", "path": aborted}, {"op": "wait", "path": checked}], **tenants))
    while not os.path.exists(aborted):
        assert e.proc.poll() is None, e.log()[-4000:]
        time.sleep(0.1)
    ns = only_ns(daemon.socket, model)
    assert int(ns[0]["leases"]) == 0, ns
    assert int(ns[0]["sessions"]) == 2  # the engine's scheduler and worker
    tenant_ns = [n for n in namespaces(daemon.socket)
                 if n["name"] == "tb." + ns[0]["name"]]
    open(checked, "w").close()
    restored, salted, _, _, _ = e.results()
    hits = (f"\n{arch}: vLLM's own prefix cache hit "
            f"{second['num_cached_tokens']} tokens, kvtier after a restart "
            f"{restored['num_cached_tokens']} of the 1,100-token prompt")
    assert restored["num_cached_tokens"] >= FULL_BLOCK_TOKENS
    assert restored["num_cached_tokens"] <= second["num_cached_tokens"]
    assert restored["token_ids"] == second["token_ids"]
    assert restored["logprobs"] == second["logprobs"]
    assert salted["num_cached_tokens"] == 0
    assert len(tenant_ns) == 1 and int(tenant_ns[0]["pages"]) >= 8, tenant_ns
    assert int(tenant_ns[0]["sessions"]) == 2, tenant_ns
    # The daemon has no --namespace_acl: the engine says its namespaces are
    # shared with every engine of the node.
    assert f"namespace '{ns[0]['name']}' is governed by no --namespace_acl" in e.log()

    # Process 3 with a test-only fault that corrupts one loaded block: the
    # same comparison fails, so it can see wrong KV. Tenant b's prompt is
    # served from its own namespace.
    e3 = start_engine(script(arch, model, daemon.socket, [
        gen(), gen(cache_salt="tenant-b")], **tenants),
        env={"KVTIER_VLLM_FAULT": "corrupt-load"})
    # Process 4, once process 3 has read its config: the same model path
    # with another config.json is another model, and nothing is served from
    # the old namespace.
    deadline = time.monotonic() + 600
    while not (os.path.exists(e3.out_path) and open(e3.out_path).read()):
        assert e3.proc.poll() is None, e3.log()[-4000:]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    make_model(arch, model, weights=False, rms_norm_eps=2e-5)
    e4 = start_engine(script(arch, model, daemon.socket, [gen()]))
    corrupt, tenant_b = e3.results()
    assert corrupt["num_cached_tokens"] >= FULL_BLOCK_TOKENS
    assert corrupt["logprobs"] != second["logprobs"]
    assert tenant_b["num_cached_tokens"] >= FULL_BLOCK_TOKENS
    (changed,) = e4.results()
    assert changed["num_cached_tokens"] == 0
    assert len(only_ns(daemon.socket, model)) == 2
    return hits


def test_concurrent_engines_share_the_tier(daemon, start_engine, tmp_path):
    model = make_model("llama")
    prompt = [(i * 13) % 991 + 3 for i in range(1100)]
    stored, b_ready = str(tmp_path / "stored"), str(tmp_path / "b_ready")
    # A publishes vLLM's KV events: what the connector stored shows there
    # as BlockStored with medium "CPU", beside vLLM's own ("GPU") events.
    endpoint = f"ipc://{tmp_path}/kv-events"  # vLLM binds ipc endpoints
    import msgspec
    import zmq
    from vllm.distributed.kv_events import BlockStored, KVEventBatch
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    a = start_engine(dict(script("llama", model, daemon.socket, [
        {"op": "wait", "path": b_ready}, gen(prompt), {"op": "touch", "path": stored},
        {"op": "wait", "path": str(tmp_path / "b_done")}]),
        kv_events_endpoint=endpoint))
    b_generated, checked = str(tmp_path / "b_generated"), str(tmp_path / "checked")
    b = start_engine(script("llama", model, daemon.socket, [
        {"op": "touch", "path": b_ready}, {"op": "wait", "path": stored}, gen(prompt),
        {"op": "touch", "path": b_generated}, {"op": "wait", "path": checked},
        {"op": "touch", "path": str(tmp_path / "b_done")}]))
    # Both engines up and attached: each one's scheduler and worker sessions
    # are one client instance (the fence protocol), so the daemon sees two.
    deadline = time.monotonic() + 600
    while not os.path.exists(b_generated) and time.monotonic() < deadline:
        time.sleep(0.1)
    instances = ctl_json(daemon.socket, "status").get("instances", 0)
    open(checked, "w").close()
    assert instances == 2
    (b_out,) = [r for r in b.results() if r["op"] == "generate"]
    (a_out,) = [r for r in a.results() if r["op"] == "generate"]
    assert a_out["num_cached_tokens"] == 0
    assert b_out["num_cached_tokens"] >= FULL_BLOCK_TOKENS
    assert b_out["token_ids"] == a_out["token_ids"]
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    cpu_blocks = 0
    while sub.poll(timeout=2000):
        _, _, payload = sub.recv_multipart()
        for ev in decoder.decode(payload).events:
            if isinstance(ev, BlockStored) and ev.medium == "CPU":
                cpu_blocks += len(ev.block_hashes)
    sub.close()
    assert cpu_blocks >= 8  # the prompt's 8 full blocks, stored by A


def test_daemon_down_at_start_then_up_then_killed(start_engine, tmp_path):
    model = make_model("llama")
    d = kvtier.Daemon(flags=["--default_namespace_bytes=268435456"])
    p1 = [(i * 5) % 983 + 2 for i in range(600)]
    p2 = [(i * 11) % 977 + 2 for i in range(600)]
    f = {k: str(tmp_path / k) for k in ("served", "up", "stored", "killed")}
    e = start_engine(script("llama", model, d.socket, [
        gen(p1, max_tokens=4), {"op": "touch", "path": f["served"]},
        {"op": "wait", "path": f["up"]}, gen(p2, max_tokens=4),
        {"op": "touch", "path": f["stored"]}, {"op": "wait", "path": f["killed"]},
        gen(p1, max_tokens=4), gen(p2, max_tokens=4),
        gen([(i * 3) % 971 + 5 for i in range(600)], max_tokens=4)], retry_s=0.2))
    try:
        while not os.path.exists(f["served"]):
            assert e.proc.poll() is None, e.log()[-4000:]
            time.sleep(0.1)
        d.start()
        time.sleep(0.5)  # past retry_s
        open(f["up"], "w").close()
        while not os.path.exists(f["stored"]):
            assert e.proc.poll() is None, e.log()[-4000:]
            time.sleep(0.1)
        ns = only_ns(d.socket, model)
        assert len(ns) == 1 and int(ns[0]["pages"]) >= 4, ns  # p2's blocks
        d.kill()
        open(f["killed"], "w").close()
        results = [r for r in e.results() if r["op"] == "generate"]
    finally:
        d.close()
    assert len(results) == 5
    assert all(len(r["token_ids"]) == 4 for r in results)
    assert results[0]["num_cached_tokens"] == 0
    log = e.log()
    # One warning per role (scheduler, worker), not one per request.
    assert 1 <= log.count("no daemon at") <= 2, log[-4000:]


def test_unknown_config_key_fails_at_start_naming_it(run_engine, tmp_path):
    from conftest import Engine
    model = make_model("llama")
    e = Engine(str(tmp_path), script("llama", model, "/nonexistent.sock", [gen()],
                                     sokcet="typo"))
    e.proc.wait(timeout=600)
    assert e.proc.returncode != 0
    assert "unknown key 'sokcet'" in e.log()
