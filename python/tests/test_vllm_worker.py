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


def hybrid_cache(num_blocks=64, mamba_groups=1):
    """One attention and `mamba_groups` Mamba groups of one layer each,
    overlaid on the same block slots, as vLLM's hybrid allocator places a
    Qwen3-Next (its full size: three Mamba groups)."""
    mamba = [f"mamba{g}" for g in range(mamba_groups)]
    p = Placement(("attn", *mamba), 0, PAGE, PAGE)  # layer_stride 0: overlaid
    return CacheDescription(num_blocks, (p,), (Group("attention", BS, ("attn",)),
                                               *(Group("mamba", BS, (m,)) for m in mamba)),
                            BS, "bfloat16")


IDENTITY = NamespaceIdentity("tiny", "", "c0ffee" * 10, "bfloat16", "auto", BS, 1, 1,
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
    many = [f"m{i}" for i in range(65)]
    with pytest.raises(ValueError, match="at most 64 Mamba groups"):
        CacheDescription(8, (layer_first(8, ["a", *many]),),
                         (Group("attention", BS, ("a",)),
                          *(Group("mamba", BS, (m,)) for m in many)), BS, "bf16")
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
                   {"block_size": 32}, {"tp_size": 2}, {"pp_size": 2},
                   {"dtype": "float16"}, {"model": "other"}):
        names.add(dataclasses.replace(IDENTITY, **change).default_name())
    assert len(names) == 8
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
    assert job.snapshot_blocks == ((40,) if kind == "hybrid" else ())
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


def block_table(cache, attn, state, window):
    """vLLM's block ids of a 41-block request, per group of `cache`: `attn`
    (41) for full attention, Mamba group g's state after page 40 in block
    state + g, a sliding-window group's blocks window, window + 1, ..."""
    out, mamba = [], 0
    for g in cache.groups:
        if g.kind == "attention":
            out.append(list(attn))
        elif g.kind == "mamba":
            ids = [0] * len(attn)
            ids[39] = state + mamba
            mamba += 1
            out.append(ids)
        else:
            out.append([window + i for i in range(len(attn))])
    return tuple(out)


def forty_blocks_stored(sched, req_id):
    """A 40-block request (blocks 7..46, Mamba states from block 200, window
    blocks from 47) and the scheduler's job storing it: (blocks, request,
    job)."""
    blocks = list(range(7, 7 + 40))
    req = FakeRequest(req_id, list(range(40 * BS + 1)))
    sched.matched_tokens(req, 0)
    table = block_table(sched.cache, blocks + [99], 200, 47)
    return blocks, req, sched.plan_store(req_id, 40 * BS, table)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", ["layer_first", "block_first", "hybrid", "mamba3",
                                  "sliding"])
def test_cuda_worker_matches_the_cpu_path(daemon, kind):
    """The worker half on CUDA tensors laid out as vLLM lays them: blocks
    stored from the GPU and loaded into a CPU buffer (and back) are the
    bytes the CPU path moves; for the hybrid shapes (one and three Mamba
    groups) the state blocks too, and for a sliding-window model each
    page's window block."""
    if kind in ("hybrid", "mamba3"):
        cache = hybrid_cache(256, mamba_groups=3 if kind == "mamba3" else 1)
    elif kind == "sliding":
        cache = sliding_cache(256, window=40 * BS)
    else:
        cache = attention_cache(256, layer_first if kind == "layer_first" else block_first)
    name = f"unit-gpu-{kind}"
    cfg, layout, sched = parts(daemon, cache, name)
    gpu = KvtierWorker(cfg, name, layout, cache)
    gpu.register(buffer_for(cache, "cuda", seed=3))
    assert gpu.descriptor().backend == "cuda"
    cpu = KvtierWorker(cfg, name, layout, cache)
    cpu.register(buffer_for(cache, "cpu", seed=4))
    blocks, req, job = forty_blocks_stored(sched, "g")
    gpu.store([job])
    report = gpu.flush()
    assert report.stored == [("g", 0, 40)], report
    sched.on_report(report)
    states = len(cache.mamba_groups)
    windowed = 40 if cache.sliding_groups else 0

    def extras(worker, state, window):  # state and window blocks' bytes
        return ([block_bytes(worker, state + g) for g in range(states)],
                [block_bytes(worker, window + i) for i in range(windowed)])
    want = [block_bytes(gpu, b) for b in blocks]
    want_extras = extras(gpu, 200, 47)
    req2 = FakeRequest("g2", req.tokens)
    assert sched.matched_tokens(req2, 0) == 40 * BS
    dst = list(range(100, 140))
    sched.after_alloc(req2, block_table(cache, dst + [0], 210, 141), 40 * BS)
    cpu.load(sched.take_loads())
    sched.on_report(cpu.poll())
    assert [block_bytes(cpu, b) for b in dst] == want
    assert extras(cpu, 210, 141) == want_extras
    # And into the GPU again, elsewhere, on a side stream.
    req3 = FakeRequest("g3", req.tokens)
    assert sched.matched_tokens(req3, 0) == 40 * BS
    dst3 = list(range(150, 190))
    sched.after_alloc(req3, block_table(cache, dst3 + [0], 220, 191), 40 * BS)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        gpu.load(sched.take_loads())
    side.synchronize()
    sched.on_report(gpu.flush())
    assert sched.num_pinned == 0
    assert [block_bytes(gpu, b) for b in dst3] == want
    assert extras(gpu, 220, 191) == want_extras
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


# -- parallel engines (TP x PP workers as one namespace's ranks) ---------------------

# Each rank's bank (the daemon's default, 1 GiB a rank, would put 4 GiB in
# /dev/shm for each TP x PP = 4 namespace).
RANK_BANK = 16 << 20


def tp_engine(daemon, cache, name, ranks, seed):
    """A scheduler (rank 0's session) and one worker per rank, each rank's
    buffer its own shard (another seed per rank)."""
    cfg = ConnectorConfig.parse({"socket": daemon.socket, "host_bytes": RANK_BANK})
    layout = namespace_layout(cache, IDENTITY, 32, ranks)
    sched = KvtierScheduler(cfg, name, layout, cache, ranks=ranks)
    workers = []
    for rank in range(ranks.world):
        w = KvtierWorker(cfg, name, layout, cache, ranks=ranks, rank=rank)
        w.register(buffer_for(cache, seed=seed * 100 + rank))
        workers.append(w)
    return sched, workers


def step(sched, workers, loads=(), stores=()):
    """One engine step: every rank loads and stores, then reports."""
    for w in workers:
        w.load(list(loads))
        w.store(list(stores))
    reports = [w.poll() for w in workers]
    for r in reports:
        sched.on_report(r)
    return reports


@pytest.mark.parametrize("kind", ["attention", "hybrid"])
def test_tp_ranks_store_and_load_their_own_shards(daemon, kind):
    from kvtier.vllm.layout import Ranks
    cache = hybrid_cache() if kind == "hybrid" else attention_cache()
    ranks = Ranks(tp_size=2, pp_size=2)
    name = f"unit-tp-{kind}"
    sched_a, workers_a = tp_engine(daemon, cache, name, ranks, seed=1)
    req = FakeRequest("t1", list(range(4 * BS + 1)))
    assert sched_a.matched_tokens(req, 0) == 0
    blocks = ([10, 11, 12, 13, 14], [0, 0, 0, 40, 0])
    job = sched_a.plan_store("t1", 4 * BS, blocks)
    reports = step(sched_a, workers_a, stores=[job])
    assert [r.rank for r in reports] == [0, 1, 2, 3]
    assert all(r.stored == [("t1", 0, 4)] for r in reports)
    # KV events: once, after every rank committed.
    assert [e.hashes for e in sched_a.take_stored()] == [tuple(sched_a.page_hashes(req))]
    expected = [[block_bytes(w, b) for b in (10, 11, 12, 13)] for w in workers_a]
    assert expected[0] != expected[1]  # the shards differ: a mix-up would show
    sched_a.finished("t1")

    # Engine B: one lookup (rank 0's session) answers for all ranks; each
    # worker copies its own rank's rows.
    sched_b, workers_b = tp_engine(daemon, cache, name, ranks, seed=2)
    req_b = FakeRequest("t2", req.tokens)
    assert sched_b.matched_tokens(req_b, 0) == 4 * BS
    sched_b.after_alloc(req_b, ([3, 4, 5, 6, 7], [0, 0, 0, 50, 0]), 4 * BS)
    loads = sched_b.take_loads()
    assert len(loads[0].hashes) == 4 and loads[0].first_page == 0
    # Rank 0 alone done: the pin stays for the others.
    sched_b.on_report(dataclasses.replace(workers_b[0].poll(), loaded={"t2"}))
    assert sched_b.num_pinned == 1
    step(sched_b, workers_b, loads=loads)
    assert sched_b.num_pinned == 0
    for w, want in zip(workers_b, expected):
        assert [block_bytes(w, b) for b in (3, 4, 5, 6)] == want
    assert [w.stats.take()["rank_lookups"] for w in workers_b] == [0, 1, 1, 1]
    for x in [*workers_a, *workers_b, sched_a, sched_b]:
        x.close()


def test_ranks_that_disagree_hit_only_their_common_prefix(daemon):
    """Rank 1's store of the last two pages fails (as a cap or the fence
    would refuse it) while rank 0 commits them: no page counts as stored,
    and the next lookup hits exactly the prefix both ranks hold."""
    from kvtier.vllm.layout import Ranks
    cache = attention_cache()
    ranks = Ranks(tp_size=2)
    name = "unit-tp-disagree"
    sched, workers = tp_engine(daemon, cache, name, ranks, seed=3)
    req = FakeRequest("d1", list(range(5 * BS + 1)))
    sched.matched_tokens(req, 0)
    first = sched.plan_store("d1", 3 * BS, ([1, 2, 3, 4, 5, 6],))
    step(sched, workers, stores=[first])
    assert [e.hashes for e in sched.take_stored()] == [tuple(sched.page_hashes(req, 3))]
    second = sched.plan_store("d1", 5 * BS, ([1, 2, 3, 4, 5, 6],))
    assert second.first_page == 3
    workers[0].store([second])
    r0 = workers[0].poll()
    assert r0.stored == [("d1", 3, 2)]
    sched.on_report(r0)
    assert sched.take_stored() == []  # rank 1 has not committed them
    r1 = workers[1].poll()
    r1.failed_stores.add(("d1", 3))  # rank 1 refused
    sched.on_report(r1)
    assert sched.take_stored() == []
    assert sched.tally.pending == 0
    sched.finished("d1")
    probe = FakeRequest("d2", req.tokens)
    assert sched.matched_tokens(probe, 0) == 3 * BS  # never rank 0's 5
    sched.finished("d2")
    for x in [*workers, sched]:
        x.close()


def test_parallel_shapes_the_namespace_cannot_hold_are_refused():
    from kvtier.vllm.layout import Ranks
    with pytest.raises(ValueError, match="at most 64 ranks"):
        Ranks(tp_size=16, pp_size=8)
    with pytest.raises(ValueError, match="pipeline_parallel_size=2 with KV"):
        Ranks(tp_size=2, pp_size=2, replicated=True)
    mla = Ranks(tp_size=4, replicated=True)
    assert mla.storing == {0} and all(mla.own_rows(r) for r in range(4))
    assert Ranks(2, 2).rank(1, 1) == 3 and Ranks(2, 2).storing == {0, 1, 2, 3}
    layout = namespace_layout(attention_cache(), IDENTITY, 32, Ranks(4, 2))
    assert layout.tp_size == 8 and not layout.replicated


def test_a_stopped_daemon_is_attached_in_the_background(tmp_path):
    """With the daemon SIGSTOPped, the halves' first attach runs on the
    link's thread: lookups miss and stores are skipped (counted) without
    waiting for it; once the daemon runs again, the attach completes and
    blocks go round trip."""
    import os
    import signal
    import time
    d = kvtier.Daemon()
    with d:
        cache = attention_cache()
        cfg = ConnectorConfig.parse({"socket": d.socket, "retry_s": 0.05})
        layout = namespace_layout(cache, IDENTITY, 32)
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            sched = KvtierScheduler(cfg, "unit-bg", layout, cache, background=True)
            worker = KvtierWorker(cfg, "unit-bg", layout, cache, background=True)
            worker.register(buffer_for(cache))  # waits its bounded start time
            assert sched.link.attach_all(wait_s=0.01) == set()
            req = FakeRequest("bg", list(range(3 * BS + 1)))
            assert sched.matched_tokens(req, 0) == 0
            # The answer came while the scheduler's attach was still under
            # way (the worker's first attempt may have run out of time
            # during its bounded start wait: retried later).
            assert sched.link.attaching and not worker.link.attached
            job = StoreJobFor(req)
            worker.store([job])
            assert worker.poll().failed_stores == {("bg", 0)}
            assert sched.stats.take()["lookups_skipped"] == 1
            assert worker.stats.take()["stores_skipped"] == 1
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while not (sched.link.attached and worker.poll().attached):
            assert time.monotonic() < deadline
            sched.link.namespace()
            time.sleep(0.05)
        worker.store([StoreJobFor(req)])
        assert worker.poll().stored == [("bg", 0, 3)]
        req2 = FakeRequest("bg2", req.tokens)
        assert sched.matched_tokens(req2, 0) == 3 * BS
        sched.finished("bg2")
        worker.close()
        sched.close()


def StoreJobFor(req):
    """The store job of `req`'s 3 full blocks (blocks 1..3)."""
    from kvtier.vllm.worker import StoreJob
    hashes = [bytes(h) for h in req.block_hashes[:3]]
    return StoreJob(req.request_id, 0, (1, 2, 3), tuple(hashes))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", ["block_first", "hybrid"])
def test_cuda_tp_shards_match_the_cpu_path(daemon, kind):
    """A TP=2 engine's workers on CUDA tensors laid out as vLLM lays them
    (each rank its own shard): stored from the GPU, loaded by CPU workers of
    the same ranks (rank 1 through its own lookup of the chain) and by the
    GPU workers again on a side stream, byte for byte."""
    from kvtier.vllm.layout import Ranks
    cache = hybrid_cache(256) if kind == "hybrid" else attention_cache(256, block_first)
    ranks = Ranks(tp_size=2)
    name = f"unit-gpu-tp-{kind}"
    cfg = ConnectorConfig.parse({"socket": daemon.socket, "host_bytes": RANK_BANK})
    layout = namespace_layout(cache, IDENTITY, 32, ranks)
    sched = KvtierScheduler(cfg, name, layout, cache, ranks=ranks)
    gpus, cpus = [], []
    for rank in range(2):
        g = KvtierWorker(cfg, name, layout, cache, ranks=ranks, rank=rank)
        g.register(buffer_for(cache, "cuda", seed=10 + rank))
        c = KvtierWorker(cfg, name, layout, cache, ranks=ranks, rank=rank)
        c.register(buffer_for(cache, "cpu", seed=20 + rank))
        gpus.append(g)
        cpus.append(c)
    blocks, req, job = forty_blocks_stored(sched, "tg")
    for g in gpus:
        g.store([job])
    for g in gpus:
        report = g.flush()
        assert report.stored == [("tg", 0, 40)], report
        sched.on_report(report)
    want = [[block_bytes(g, b) for b in blocks] for g in gpus]
    assert want[0] != want[1]
    dst = list(range(100, 140))
    mamba2 = [0] * 41
    mamba2[39] = 210
    for workers, label in ((cpus, "cpu"), (gpus, "gpu")):
        r = FakeRequest(f"tg-{label}", req.tokens)
        assert sched.matched_tokens(r, 0) == 40 * BS
        sched.after_alloc(r, (dst + [0], mamba2), 40 * BS)
        loads = sched.take_loads()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            for w in workers:
                w.load(loads)
        side.synchronize()
        for w in workers:
            sched.on_report(w.flush())
        assert sched.num_pinned == 0
        for w, shard in zip(workers, want):
            assert [block_bytes(w, b) for b in dst] == shard
        if kind == "hybrid":
            for w, g in zip(workers, gpus):
                assert block_bytes(w, 210) == block_bytes(g, 200)
    for x in (*gpus, *cpus, sched):
        x.close()


def test_several_mamba_groups_store_one_state_block_each(daemon):
    """Three Mamba groups beside the attention group (vLLM's grouping of a
    full-size Qwen3-Next): the snapshot row holds each group's state block
    at the page boundary; a load restores each into the new request's block
    of that group, byte for byte. A group without a block there (vLLM's
    null block) stores and loads nothing."""
    cache = hybrid_cache(mamba_groups=3)
    assert len(cache.mamba_groups) == 3 and cache.regions() == [Region(0, PAGE, PAGE)]
    layout = namespace_layout(cache, IDENTITY, 32)
    assert layout.snapshot_row_bytes == 3 * PAGE
    name = "unit-mamba3"
    cfg, layout, sched = parts(daemon, cache, name)
    a = KvtierWorker(cfg, name, layout, cache)
    a.register(buffer_for(cache, seed=5))
    req = FakeRequest("m3", list(range(4 * BS + 1)))
    assert sched.matched_tokens(req, 0) == 0
    attn = [10, 11, 12, 13, 14]
    groups = ([0, 0, 0, 40, 0], [0, 0, 0, 41, 0], [0, 0, 0, 42, 0])
    null = ([0] * 5, [0, 0, 0, 41, 0], [0, 0, 0, 42, 0])
    assert sched.plan_store("m3", 4 * BS, (attn, *null)) is None
    job = sched.plan_store("m3", 4 * BS, (attn, *groups))
    assert job.snapshot_blocks == (40, 41, 42)
    a.store([job])
    sched.on_report(a.poll())
    states = [block_bytes(a, b) for b in (40, 41, 42)]
    assert len(set(states)) == 3
    sched.finished("m3")

    b = KvtierWorker(cfg, name, layout, cache)
    b.register(buffer_for(cache, seed=6))
    req_b = FakeRequest("m3b", req.tokens)
    assert sched.matched_tokens(req_b, 0) == 4 * BS
    sched.after_alloc(req_b, ([3, 4, 5, 6, 7], [0, 0, 0, 50, 0], [0, 0, 0, 51, 0],
                              [0, 0, 0, 52, 0]), 4 * BS)
    (load,) = sched.take_loads()
    assert load.snapshot_blocks == (50, 51, 52)
    b.load([load])
    sched.on_report(b.poll())
    assert [block_bytes(b, x) for x in (50, 51, 52)] == states
    assert [block_bytes(b, x) for x in (3, 4, 5, 6)] == \
        [block_bytes(a, x) for x in (10, 11, 12, 13)]
    for x in (a, b, sched):
        x.close()


def sliding_cache(num_blocks=64, window=2 * BS):
    """A full-attention and a sliding-window group of one layer each,
    overlaid on the same block slots (vLLM's grouping of Gemma 3)."""
    p = Placement(("full", "swa"), 0, PAGE, PAGE)
    return CacheDescription(num_blocks, (p,), (Group("sliding", BS, ("swa",), window),
                                               Group("attention", BS, ("full",))),
                            BS, "bfloat16")


def test_sliding_window_pages_carry_the_windows_blocks(daemon):
    """A page row holds the full-attention block and the sliding-window
    block of the page. Stored only while vLLM holds both; a resume loads
    the sliding-window blocks of the window before it alone (vLLM gives
    the earlier pages none), and refuses to load when a window page has
    no block."""
    cache = sliding_cache()
    assert cache.page_groups == 2 and cache.window_pages(0) == 2
    layout = namespace_layout(cache, IDENTITY, 32)
    assert layout.page_banks[0].row_bytes == 2 * PAGE
    name = "unit-swa"
    cfg, layout, sched = parts(daemon, cache, name)
    a = KvtierWorker(cfg, name, layout, cache)
    a.register(buffer_for(cache, seed=7))
    req = FakeRequest("w", list(range(4 * BS + 1)))
    sched.matched_tokens(req, 0)
    swa, full = [20, 21, 22, 23, 24], [10, 11, 12, 13, 14]
    job = sched.plan_store("w", 4 * BS, (swa, full))
    assert job.group_blocks == ((20, 21, 22, 23),)
    a.store([job])
    sched.on_report(a.poll())
    sched.finished("w")
    # A request whose early sliding-window blocks vLLM dropped stores nothing.
    gone = FakeRequest("w-gone", list(range(1000, 1000 + 4 * BS + 1)))
    sched.matched_tokens(gone, 0)
    assert sched.plan_store("w-gone", 4 * BS, ([0, 0, 32, 33, 34], full)) is None
    assert sched.stats.take()["window_unstorable"] == 1

    b = KvtierWorker(cfg, name, layout, cache)
    b.register(buffer_for(cache, seed=8))
    r = FakeRequest("w2", req.tokens)
    assert sched.matched_tokens(r, 0) == 4 * BS
    sched.after_alloc(r, ([0, 0, 42, 43, 44], [3, 4, 5, 6, 7]), 4 * BS)
    (load,) = sched.take_loads()
    assert load.group_blocks == ((0, 0, 42, 43),)
    before = [block_bytes(b, x) for x in (40, 41)]
    b.load([load])
    sched.on_report(b.poll())
    assert [block_bytes(b, x) for x in (3, 4, 5, 6)] == \
        [block_bytes(a, x) for x in (10, 11, 12, 13)]
    assert [block_bytes(b, x) for x in (42, 43)] == [block_bytes(a, x) for x in (22, 23)]
    assert [block_bytes(b, x) for x in (40, 41)] == before
    # vLLM gave a window page no block: recompute, nothing loaded.
    r3 = FakeRequest("w3", req.tokens)
    assert sched.matched_tokens(r3, 0) == 4 * BS
    sched.after_alloc(r3, ([0, 0, 0, 53, 0], [30, 31, 32, 33, 34]), 4 * BS)
    (bad,) = sched.take_loads()
    assert bad.rows == ()
    b.load([bad])
    report = b.poll()
    assert report.failed_loads == {"w3"}
    sched.on_report(report)
    for x in (a, b, sched):
        x.close()
