"""The vLLM connector's vLLM-free halves (kvtier.vllm.config, .layout,
.scheduler, .worker) against a real kvtierd: configuration errors name the
key; vLLM's buffer layouts (layer-first, block-first, hybrid overlays) map
onto rows; blocks stored by one worker come back bit-identical into another
worker's blocks, through the scheduler's pinned lookups, for attention-only
and hybrid caches, on the CPU (reference copy) and, where a GPU is present,
on CUDA tensors (compared bit for bit with the CPU path).

These run without vLLM: vLLM's objects are replaced by the plain data the
connector extracts from them (layout.CacheDescription) and by duck-typed
requests, exactly what connector.py hands these classes.
"""

import dataclasses
import hashlib

import pytest
import torch

import kvtier
from kvtier.vllm.config import ConnectorConfig
from kvtier.vllm.layout import (CacheDescription, Group, NamespaceIdentity,
                                Placement, Region, namespace_layout)
from kvtier.vllm.link import LayoutRefused, TierLink
from kvtier.vllm.scheduler import KvtierScheduler
from kvtier.vllm.worker import KvtierWorker

BS = 16  # tokens per block
PAGE = 2 * BS * 2 * 64 * 2  # K+V, 16 tokens, 2 heads, dim 64, bf16


def layer_first(num_blocks, layers, page=PAGE):
    """vLLM's LBHNC-style placement: each layer's blocks contiguous."""
    return Placement(tuple(layers), page * num_blocks, page, page)


def block_first(num_blocks, layers, page=PAGE):
    """BLHNC-style: block b holds every layer's page back to back."""
    return Placement(tuple(layers), page, page * len(layers), page)


def attention_cache(num_blocks=64, placement=layer_first, layers=("l0", "l1")):
    return CacheDescription(num_blocks, (placement(num_blocks, layers),),
                            (Group("attention", BS, tuple(layers)),), BS, "bfloat16")


def hybrid_cache(num_blocks=64):
    # One attention and one Mamba layer overlaid on the same block slots.
    p = Placement(("attn", "mamba"), 0, PAGE, PAGE)  # layer_stride 0: overlaid
    return CacheDescription(num_blocks, (p,), (Group("attention", BS, ("attn",)),
                                               Group("mamba", BS, ("mamba",))),
                            BS, "bfloat16")


IDENTITY = NamespaceIdentity("tiny", "", "c0ffee" * 10, "bfloat16", "auto", BS, 1, 0,
                             "sha256")


@dataclasses.dataclass
class FakeRequest:
    """What the scheduler half reads of a vLLM Request."""
    request_id: str
    tokens: list

    @property
    def num_tokens(self):
        return len(self.tokens)

    @property
    def all_token_ids(self):
        return self.tokens

    @property
    def block_hashes(self):  # vLLM's chain: one hash per full block
        out, h = [], b"seed"
        for i in range(len(self.tokens) // BS):
            h = hashlib.sha256(h + bytes(str(self.tokens[i * BS:(i + 1) * BS]),
                                         "ascii")).digest()
            out.append(h)
        return out


def buffer_for(cache, device="cpu", seed=0):
    need = max(r.offset + (cache.num_blocks - 1) * r.stride + r.nbytes
               for r in cache.regions())
    g = torch.Generator().manual_seed(seed)
    buf = torch.randint(0, 256, (need,), dtype=torch.uint8, generator=g)
    return buf.to(device)


def block_bytes(worker, block):
    return b"".join(bytes(worker.buffer[r.offset + block * r.stride:
                                        r.offset + block * r.stride + r.nbytes].cpu().numpy())
                    for r in worker.regions)


def parts(daemon, cache, name):
    cfg = ConnectorConfig.parse({"socket": daemon.socket})
    layout = namespace_layout(cache, IDENTITY, 32)
    return cfg, layout, KvtierScheduler(cfg, name, layout, cache)


def primed(daemon, name):
    """A scheduler and a worker of namespace `name` in which a request of
    3 full blocks (and one token more) has been stored; returns them and the
    request's tokens."""
    cache = attention_cache()
    cfg, layout, sched = parts(daemon, cache, name)
    worker = KvtierWorker(cfg, name, layout, cache)
    worker.register(buffer_for(cache))
    req = FakeRequest(f"{name}-first", list(range(3 * BS + 1)))
    sched.matched_tokens(req, 0)
    worker.store([sched.plan_store(req.request_id, 3 * BS, ([1, 2, 3, 4],))])
    sched.on_report(worker.poll())
    return sched, worker, req.tokens


# -- configuration --------------------------------------------------------------

def test_config_errors_name_the_key():
    assert ConnectorConfig.parse(None).store == "all"
    with pytest.raises(ValueError, match="unknown key 'sockt'"):
        ConnectorConfig.parse({"sockt": "/x"})
    with pytest.raises(ValueError, match=r"\['timeout_ms'\]: expected int, got str"):
        ConnectorConfig.parse({"timeout_ms": "5"})
    with pytest.raises(ValueError, match=r"\['host_bytes'\]: expected int, got bool"):
        ConnectorConfig.parse({"host_bytes": True})
    with pytest.raises(ValueError, match=r"\['store'\]: 'some' is not one of"):
        ConnectorConfig.parse({"store": "some"})
    with pytest.raises(ValueError, match=r"\['kv_cache_layout'\]"):
        ConnectorConfig.parse({"kv_cache_layout": "XYZ"})
    assert ConnectorConfig.parse({"retry_s": 1}).retry_s == 1.0


# -- layouts --------------------------------------------------------------------

def test_layer_first_block_first_and_overlaid_regions():
    lf = attention_cache(placement=layer_first)
    assert lf.regions() == [Region(0, PAGE, PAGE), Region(64 * PAGE, PAGE, PAGE)]
    bf = attention_cache(placement=block_first)
    assert bf.regions() == [Region(0, 2 * PAGE, 2 * PAGE)]  # one run per block
    assert lf.row_bytes == bf.row_bytes == 2 * PAGE
    hy = hybrid_cache()
    assert hy.hybrid and hy.regions() == [Region(0, PAGE, PAGE)]
    layout = namespace_layout(hy, IDENTITY, 32)
    assert layout.snapshot_row_bytes == PAGE and layout.page_banks[0].row_bytes == PAGE


def test_unsupported_caches_are_refused():
    with pytest.raises(ValueError, match="exactly one full-attention"):
        CacheDescription(8, (layer_first(8, ["m"]),), (Group("mamba", BS, ("m",)),),
                         BS, "bf16")
    with pytest.raises(ValueError, match="Mamba groups"):
        CacheDescription(8, (layer_first(8, ["a", "m1", "m2"]),),
                         (Group("attention", BS, ("a",)), Group("mamba", BS, ("m1",)),
                          Group("mamba", BS, ("m2",))), BS, "bf16")
    with pytest.raises(ValueError, match="cannot store"):
        CacheDescription(8, (layer_first(8, ["a", "s"]),),
                         (Group("attention", BS, ("a",)), Group("other", BS, ("s",))),
                         BS, "bf16")
    with pytest.raises(ValueError, match="overlap without coinciding"):
        CacheDescription(8, (Placement(("a", "b"), PAGE // 2, PAGE, PAGE),),
                         (Group("attention", BS, ("a", "b")),), BS, "bf16").regions()


def test_identity_separates_what_hashes_do_not():
    names = {IDENTITY.default_name()}
    for change in ({"config_digest": "beef" * 16}, {"kv_cache_dtype": "fp8"},
                   {"block_size": 32}, {"tp_rank": 1}, {"dtype": "float16"},
                   {"model": "other"}):
        names.add(dataclasses.replace(IDENTITY, **change).default_name())
    assert len(names) == 7
    assert all(len(n) <= 64 and n.startswith("vllm-") for n in names)


# -- scheduler + worker against a daemon ------------------------------------------

@pytest.mark.parametrize("kind", ["layer_first", "block_first", "hybrid"])
def test_blocks_round_trip_between_engines(daemon, kind):
    cache = hybrid_cache() if kind == "hybrid" else attention_cache(
        placement=layer_first if kind == "layer_first" else block_first)
    name = f"unit-{kind}"
    cfg, layout, sched_a = parts(daemon, cache, name)
    worker_a = KvtierWorker(cfg, name, layout, cache)
    worker_a.register(buffer_for(cache, seed=1))
    req = FakeRequest("r1", list(range(5 * BS + 3)))
    # Engine A: nothing cached; it computes the prompt in one step and the
    # connector stores its 5 full blocks (blocks 10..14, Mamba state in 40).
    assert sched_a.matched_tokens(req, 0) == 0
    sched_a.after_alloc(req, ([10, 11, 12, 13, 14, 15], [0, 0, 0, 0, 40, 0]), 0)
    job = sched_a.plan_store("r1", 5 * BS, ([10, 11, 12, 13, 14, 15],
                                             [0, 0, 0, 0, 40, 0]))
    assert job.block_ids == (10, 11, 12, 13, 14) and job.parent is None
    assert job.snapshot_block == (40 if kind == "hybrid" else None)
    worker_a.store([job])
    report = worker_a.poll()
    assert report.stored == [("r1", 0, 5)] and not report.failed_stores
    sched_a.on_report(report)
    assert sched_a.plan_store("r1", 5 * BS + 3, ([10, 11, 12, 13, 14, 15],
                                                 [0] * 6)) is None  # nothing new
    expected = [block_bytes(worker_a, b) for b in (10, 11, 12, 13, 14)]
    expected_state = block_bytes(worker_a, 40)
    sched_a.finished("r1")

    # Engine B (another buffer): the scheduler reports 5 blocks and pins
    # them; the worker copies them into B's blocks 3..7 (state into 50).
    _, _, sched_b = parts(daemon, cache, name)
    worker_b = KvtierWorker(cfg, name, layout, cache)
    worker_b.register(buffer_for(cache, seed=2))
    req_b = FakeRequest("r2", list(range(5 * BS + 3)))
    assert sched_b.matched_tokens(req_b, 0) == 5 * BS
    assert sched_b.num_pinned == 1
    sched_b.after_alloc(req_b, ([3, 4, 5, 6, 7, 8], [0, 0, 0, 0, 50, 0]), 5 * BS)
    loads = sched_b.take_loads()
    assert [l.block_ids for l in loads] == [(3, 4, 5, 6, 7)]
    worker_b.load(loads)
    report = worker_b.poll()
    assert report.loaded == {"r2"} and not report.failed_loads and report.attached
    sched_b.on_report(report)
    assert sched_b.num_pinned == 0  # the pin went once the copy was done
    assert [block_bytes(worker_b, b) for b in (3, 4, 5, 6, 7)] == expected
    # What get_kv_connector_stats reports (one interval: take() zeroes).
    snaps = 1 if kind == "hybrid" else 0
    a_stats, b_stats = worker_a.stats.take(), worker_b.stats.take()
    assert a_stats["store_blocks"] == 5 and a_stats["store_failures"] == 0
    assert a_stats["store_bytes"] == (5 + snaps) * cache.row_bytes
    assert b_stats["load_blocks"] == 5 and b_stats["load_bytes"] == (5 + snaps) * cache.row_bytes
    assert sched_b.stats.take()["hit_tokens"] == 5 * BS
    assert worker_b.stats.take()["load_blocks"] == 0
    if kind == "hybrid":
        assert block_bytes(worker_b, 50) == expected_state
    # A shorter local hit (vLLM had 2 blocks itself): only the rest loads.
    req_c = FakeRequest("r3", list(range(5 * BS + 3)))
    assert sched_b.matched_tokens(req_c, 2 * BS) == 3 * BS
    sched_b.after_alloc(req_c, ([3, 4, 9, 10, 11, 12], [0, 0, 0, 0, 51, 0]), 3 * BS)
    assert [l.block_ids for l in sched_b.take_loads()] == [(9, 10, 11)]
    sched_b.finished("r3")  # the load was sent: the pin waits for the worker
    assert sched_b.num_pinned == 1
    sched_b.on_report(dataclasses.replace(report, loaded={"r3"}))
    assert sched_b.num_pinned == 0
    for x in (worker_a, worker_b, sched_a, sched_b):
        x.close()


def test_pins_are_dropped_on_recall_and_when_nothing_is_allocated(daemon):
    sched, worker, tokens = primed(daemon, "unit-pins")
    for i in range(50):  # vLLM may ask again; each ask drops the last pin
        r = FakeRequest(f"q{i}", tokens)
        assert sched.matched_tokens(r, 0) == 3 * BS
        assert sched.matched_tokens(r, 0) == 3 * BS
        if i % 2:
            sched.after_alloc(r, ([5, 6, 7, 8],), 0)  # vLLM took none
        else:
            sched.finished(r.request_id)  # aborted before allocation
    assert sched.num_pinned == 0
    ns = [n for n in kvtier_namespaces(daemon) if n["name"] == "unit-pins"]
    assert int(ns[0]["leases"]) == 0
    worker.close()
    sched.close()


def kvtier_namespaces(daemon):
    import json, os, subprocess
    ctl = os.environ.get("KVTIERCTL")
    if not ctl:
        pytest.skip("KVTIERCTL not set")
    out = subprocess.run([ctl, f"--socket={daemon.socket}", "--json", "namespaces"],
                         check=True, capture_output=True, text=True).stdout
    data = json.loads(out)
    return data["namespaces"] if isinstance(data, dict) else data


def test_a_layout_the_namespace_refuses_is_a_start_error(daemon):
    cfg = ConnectorConfig.parse({"socket": daemon.socket, "namespace": "unit-refuse"})
    a = TierLink(cfg, "unit-refuse", namespace_layout(attention_cache(), IDENTITY, 32),
                 "scheduler")
    assert a.namespace() is not None
    other = attention_cache(layers=("l0", "l1", "l2"))
    b = TierLink(cfg, "unit-refuse", namespace_layout(other, IDENTITY, 32), "scheduler")
    with pytest.raises(LayoutRefused, match="unit-refuse"):
        b.namespace()
    a.close()


def test_a_daemon_that_is_down_is_a_miss_then_retried(tmp_path):
    d = kvtier.Daemon()
    cache = attention_cache()
    cfg = ConnectorConfig.parse({"socket": d.socket, "retry_s": 0.05})
    layout = namespace_layout(cache, IDENTITY, 32)
    sched = KvtierScheduler(cfg, "unit-down", layout, cache)
    req = FakeRequest("d", list(range(3 * BS + 1)))
    assert sched.matched_tokens(req, 0) == 0  # no daemon: a miss, no raise
    assert sched.plan_store("d", 3 * BS, ([1, 2, 3, 4],)) is None
    with d:
        import time
        time.sleep(0.1)
        assert sched.matched_tokens(req, 0) == 0 and sched.link.attached
        assert sched.plan_store("d", 3 * BS, ([1, 2, 3, 4],)) is not None
    sched.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", ["layer_first", "block_first", "hybrid"])
def test_cuda_worker_matches_the_cpu_path(daemon, kind):
    """The worker half on CUDA tensors laid out as vLLM lays them: blocks
    stored from the GPU and loaded into a CPU buffer (and back) are the
    bytes the CPU path moves."""
    cache = hybrid_cache(256) if kind == "hybrid" else attention_cache(
        256, layer_first if kind == "layer_first" else block_first)
    name = f"unit-gpu-{kind}"
    cfg, layout, sched = parts(daemon, cache, name)
    gpu = KvtierWorker(cfg, name, layout, cache)
    gpu.register(buffer_for(cache, "cuda", seed=3))
    assert gpu.descriptor().backend == "cuda"
    cpu = KvtierWorker(cfg, name, layout, cache)
    cpu.register(buffer_for(cache, "cpu", seed=4))
    blocks = list(range(7, 7 + 40))
    req = FakeRequest("g", list(range(40 * BS + 1)))
    sched.matched_tokens(req, 0)
    mamba = [0] * 41
    mamba[39] = 200
    job = sched.plan_store("g", 40 * BS, (blocks + [99], mamba))
    gpu.store([job])
    report = gpu.flush()
    assert report.stored == [("g", 0, 40)], report
    sched.on_report(report)
    want = [block_bytes(gpu, b) for b in blocks]
    req2 = FakeRequest("g2", req.tokens)
    assert sched.matched_tokens(req2, 0) == 40 * BS
    dst = list(range(100, 140))
    mamba2 = [0] * 41
    mamba2[39] = 210
    sched.after_alloc(req2, (dst + [0], mamba2), 40 * BS)
    cpu.load(sched.take_loads())
    sched.on_report(cpu.poll())
    assert [block_bytes(cpu, b) for b in dst] == want
    if kind == "hybrid":
        assert block_bytes(cpu, 210) == block_bytes(gpu, 200)
    # And into the GPU again, elsewhere, on a side stream.
    req3 = FakeRequest("g3", req.tokens)
    assert sched.matched_tokens(req3, 0) == 40 * BS
    dst3 = list(range(150, 190))
    sched.after_alloc(req3, (dst3 + [0], mamba2), 40 * BS)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        gpu.load(sched.take_loads())
    side.synchronize()
    sched.on_report(gpu.flush())
    assert sched.num_pinned == 0
    assert [block_bytes(gpu, b) for b in dst3] == want
    for x in (gpu, cpu, sched):
        x.close()


def test_failed_loads_are_reported_once_and_unpin(daemon):
    sched, worker, tokens = primed(daemon, "unit-failload")
    r2 = FakeRequest("f2", tokens)
    assert sched.matched_tokens(r2, 0) == 3 * BS
    # vLLM took fewer tokens than the hit holds whole blocks of: the job
    # cannot be loaded as allocated and must fail, not load something.
    sched.after_alloc(r2, ([7, 8, 9, 10],), 3 * BS - 1)
    worker.load(sched.take_loads())
    report = worker.poll()
    assert report.failed_loads == {"f2"} and not report.loaded
    assert worker.poll().failed_loads == set()  # reported once
    sched.on_report(report)
    assert sched.num_pinned == 0
    worker.close()
    sched.close()


def test_no_hits_while_the_worker_cannot_copy(daemon):
    from kvtier.vllm.worker import StepReport
    sched, worker, tokens = primed(daemon, "unit-ready")
    sched.on_report(StepReport(attached=False))  # the worker lost the daemon
    assert sched.matched_tokens(FakeRequest("w2", tokens), 0) == 0
    assert sched.num_pinned == 0
    sched.on_report(worker.poll())  # attached again
    assert sched.matched_tokens(FakeRequest("w3", tokens), 0) == 3 * BS
    # vLLM's null block (0) is never stored under a real hash.
    assert sched.plan_store("w3", 3 * BS, ([1, 0, 3, 4],)) is None
    sched.close()
    worker.close()


def test_a_stalled_daemon_costs_one_deadline_per_retry_interval():
    import signal
    with kvtier.Daemon() as d:
        cache = attention_cache()
        cfg = ConnectorConfig.parse({"socket": d.socket, "timeout_ms": 200,
                                     "retry_s": 3600})
        sched = KvtierScheduler(cfg, "unit-stall", namespace_layout(cache, IDENTITY, 32),
                                cache)
        req = FakeRequest("s", list(range(3 * BS + 1)))
        assert sched.matched_tokens(req, 0) == 0 and sched.link.attached
        d.proc.send_signal(signal.SIGSTOP)
        import time
        time.sleep(0.2)  # the signal stops every thread, not at once
        try:
            assert sched.matched_tokens(FakeRequest("s2", req.tokens), 0) == 0
            assert sched.matched_tokens(FakeRequest("s3", req.tokens), 0) == 0
            stats = sched.stats.take()
        finally:
            d.proc.send_signal(signal.SIGCONT)
        assert stats["lookups"] == 2, stats  # the third was not sent
        sched.close()
