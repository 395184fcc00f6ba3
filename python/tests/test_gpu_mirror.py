"""CUDA tests of kvtier.Mirror and kvtier.DevicePool against a real kvtierd:
the mirror store captured in a torch.cuda.CUDAGraph and replayed with new
pool bytes and entries (the host rows bit for bit: whole tokens of
token-major tensors, whole pages of per-page ones, nothing else), ensure
bringing rows back into the pool (captured too), adoption making mirrored
pages visible to another session's lookup, a revoked mirror's replay writing
nothing, and the daemon's device pool: slots written through the IPC
mapping, a lookup with a device snapshot restored device-to-device, the pool
viewed as a torch tensor, UNAVAILABLE after the daemon stops. Every test
skips without CUDA (KVTIER_REQUIRE_GPU=1 makes that a failure).

Needs only libkvtier.so and kvtierd of a CUDA build ($KVTIER_LIB and
$KVTIERD, or $KVT_BIN of a device bundle, or the build tree) and torch:

    KVTIER_REQUIRE_GPU=1 python3 python/tests/test_gpu_mirror.py

runs it under pytest when pytest is installed, else with a small runner of
its own (--plain forces that).
"""

import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import kvtier  # noqa: E402

try:
    import pytest
except ImportError:  # the GPU machine may lack it: see _main
    pytest = None

PAGE = 16    # tokens per page
SLOTS = 12   # pool pages
HEADS, DIM = 2, 64
TOKEN_BYTES = HEADS * DIM * 2  # one token of K (or V), bf16


class Skipped(Exception):
    pass


def need_cuda():
    if torch.cuda.is_available():
        return
    reason = "no CUDA device"
    if os.environ.get("KVTIER_REQUIRE_GPU") == "1":
        raise AssertionError(f"{reason}, and KVTIER_REQUIRE_GPU=1")
    if pytest is not None:
        pytest.skip(reason)
    raise Skipped(reason)


def cuda_pool(seed):
    """kv: K and V [SLOTS, PAGE, HEADS, DIM] bf16 (token-major); scale: 10
    fp32 a page (40 bytes, not a multiple of PAGE: mirrored whole)."""
    kv = [torch.empty(SLOTS, PAGE, HEADS, DIM, dtype=torch.bfloat16,
                      device="cuda") for _ in range(2)]
    scale = torch.empty(SLOTS, 16, device="cuda")[:, :10]
    refill(kv, scale, seed)
    return kv, scale, kvtier.TorchPool({"kv": kv, "scale": [scale]})


def refill(kv, scale, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    for t in kv:
        t.copy_(torch.randn(t.shape, generator=g, device="cuda").to(t.dtype))
    scale.copy_(torch.randn(scale.shape, generator=g, device="cuda"))


def raw(t) -> bytes:
    return t.contiguous().view(torch.uint8).cpu().numpy().tobytes()


def kv_row(kv, slot) -> bytes:
    return b"".join(raw(t[slot]) for t in kv)


def all_tokens(pages):
    """Every token of logical pages [0, pages); logical l in slot SLOTS-1-l."""
    out = ([], [], [])
    for lp in range(pages):
        for t in range(PAGE):
            out[0].append(lp)
            out[1].append(SLOTS - 1 - lp)
            out[2].append(t)
    return out


def wait_until(done, limit_s=30.0):
    end = time.monotonic() + limit_s
    while not done():
        assert time.monotonic() < end, "condition never held"
        time.sleep(0.005)


def attach(client, name, pool, **kw):
    ns = client.attach(name, pool.layout(model=name), page_rows=64, **kw)
    assert ns.page_banks[0].cuda_registered
    return ns


def new_mirror(ns, pool, stream):
    with torch.cuda.stream(stream):
        m = ns.mirror(pool, logical_pages=32, max_batch=2, max_selected=4,
                      max_store_entries=128)
    stream.synchronize()
    assert m.backend == "cuda" and len(m.rows) == 32
    return m


def store_buffers():
    entries = kvtier.mirror_entries([], [], [], capacity=128, device="cuda")
    count = torch.zeros(1, dtype=torch.int32, device="cuda")
    return entries, count


def set_entries(entries, count, logical, slot, token):
    entries.copy_(kvtier.mirror_entries(logical, slot, token, capacity=128,
                                        device="cuda"))
    count.fill_(len(logical))


def captured(mode, stream, fn):
    """fn() run once on `stream` (loads the kernels), then captured in a
    CUDAGraph in capture_error_mode `mode`; returns the graph."""
    torch.cuda.synchronize()  # the buffers' fills on the default stream
    with torch.cuda.stream(stream):
        fn()
    stream.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, capture_error_mode=mode):
        fn()
    return g


def graph_store_and_ensure(mode):
    need_cuda()
    with kvtier.Daemon() as d, kvtier.Client(socket=d.socket) as c:
        kv, scale, pool = cuda_pool(1)
        ns = attach(c, f"graph-{mode}", pool)
        kvb, scb = ns.page_banks
        stream = torch.cuda.Stream()
        m = new_mirror(ns, pool, stream)
        entries, count = store_buffers()
        g = captured(mode, stream, lambda: m.store(entries, count))

        # Replay 1: every token of logical pages 0..3.
        set_entries(entries, count, *all_tokens(4))
        g.replay()
        torch.cuda.synchronize()
        step1 = {}
        for lp in range(4):
            step1[lp] = kv_row(kv, SLOTS - 1 - lp)
            assert kvb.read_row(m.rows[lp]) == step1[lp], f"logical {lp}"
            assert scb.read_row(m.rows[lp]) == raw(scale[SLOTS - 1 - lp])
        untouched = kvb.read_row(m.rows[4])

        # Replay 2, new pool bytes: token 5 of logical 4 (slot 0) alone.
        refill(kv, scale, 2)
        set_entries(entries, count, [4], [0], [5])
        g.replay()
        torch.cuda.synchronize()
        want = bytearray(untouched)
        for i, t in enumerate(kv):
            at = i * PAGE * TOKEN_BYTES + 5 * TOKEN_BYTES
            want[at:at + TOKEN_BYTES] = raw(t[0, 5])
        assert kvb.read_row(m.rows[4]) == bytes(want)
        assert scb.read_row(m.rows[4]) == raw(scale[0])
        for lp in range(4):
            assert kvb.read_row(m.rows[lp]) == step1[lp]
        assert m.store_drops == 0

        # Replay 3: a malformed entry (slot >= P) is dropped and counted.
        set_entries(entries, count, [5], [SLOTS], [0])
        g.replay()
        torch.cuda.synchronize()
        assert m.store_drops == 1
        store_drops, _ = m.drop_counters()
        assert store_drops.is_cuda and store_drops.item() == 1

        # Ensure, captured: the pool is lost; logical 0..3 come back.
        for t in kv + [scale]:
            t.zero_()
        selected = torch.full((2, 4), -1, dtype=torch.int32, device="cuda")
        translated = torch.full((2, 4), -7, dtype=torch.int32, device="cuda")
        torch.cuda.synchronize()
        g2 = captured(mode, stream, lambda: m.ensure(selected, translated))
        selected.copy_(torch.tensor([[0, 1, -1, -1], [2, 3, -1, -1]]))
        g2.replay()
        torch.cuda.synchronize()
        tr = translated.tolist()
        assert tr[0][2:] == [-1, -1] and tr[1][2:] == [-1, -1]
        slots = {0: tr[0][0], 1: tr[0][1], 2: tr[1][0], 3: tr[1][1]}
        assert len(set(slots.values())) == 4
        for lp, slot in slots.items():
            assert 0 <= slot < SLOTS
            assert kv_row(kv, slot) == step1[lp], f"logical {lp} in slot {slot}"
            assert raw(scale[slot]) == scb.read_row(m.rows[lp])
        # Resident pages keep their slots; an out-of-range page is dropped.
        selected.copy_(torch.tensor([[99, 2, -1, -1], [-1, -1, -1, -1]]))
        g2.replay()
        torch.cuda.synchronize()
        assert translated[0, :2].tolist() == [-1, slots[2]]
        assert m.ensure_drops == 1
        del g, g2
        m.close()


def test_graph_captured_store_and_ensure_global_mode():
    graph_store_and_ensure("global")


def test_graph_captured_store_and_ensure_thread_local_mode():
    graph_store_and_ensure("thread_local")


def test_adopted_mirror_pages_are_visible_to_another_sessions_lookup():
    need_cuda()
    with kvtier.Daemon() as d, kvtier.Client(socket=d.socket) as c:
        kv, scale, pool = cuda_pool(3)
        ns = attach(c, "adopt", pool)
        kvb, scb = ns.page_banks
        stream = torch.cuda.Stream()
        m = new_mirror(ns, pool, stream)
        entries, count = store_buffers()
        set_entries(entries, count, *all_tokens(4))
        torch.cuda.synchronize()
        with torch.cuda.stream(stream):
            m.store(entries, count)
        stream.synchronize()
        pages = [kv_row(kv, SLOTS - 1 - lp) for lp in range(4)]
        h = ns.hash_tokens(list(range(4 * PAGE)))
        with ns.lookup(h, pin=False) as miss:
            assert miss.matched_pages == 0
        assert m.adopt(range(4), h).committed_pages == 4
        with kvtier.Client(socket=d.socket, name="reader") as other:
            kv2, scale2, pool2 = cuda_pool(4)
            ns2 = attach(other, "adopt", pool2)
            torch.cuda.synchronize()  # pool2's fill, before the side stream
            with ns2.lookup(h) as lease:
                assert lease.usable_pages == 4
                assert not set(lease.rows) & set(m.rows)
                ns2.transfer(pool2).rehydrate([0, 1, 2, 3], lease.rows, stream)
                lease.release(stream)
            stream.synchronize()
            for lp in range(4):
                assert kv_row(kv2, lp) == pages[lp]
                assert raw(scale2[lp]) == raw(scale[SLOTS - 1 - lp])
        m.close()


def test_a_revoked_mirrors_graph_replay_writes_nothing():
    need_cuda()
    with kvtier.Daemon(flags=["--fence_sweep_ms=10"]) as d, \
            kvtier.Client(socket=d.socket) as c:
        kv, scale, pool = cuda_pool(5)
        ns = attach(c, "revoked", pool)
        kvb = ns.page_banks[0]
        stream = torch.cuda.Stream()
        m = new_mirror(ns, pool, stream)
        entries, count = store_buffers()
        set_entries(entries, count, *all_tokens(2))
        torch.cuda.synchronize()
        g = captured("thread_local", stream, lambda: m.store(entries, count))
        g.replay()
        torch.cuda.synchronize()
        stored = kvb.read_row(m.rows[0])
        assert stored == kv_row(kv, SLOTS - 1)
        assert not m.revoked
        d.kill()
        wait_until(lambda: m.revoked)
        d.start()
        wait_until(lambda: c.session_alive)
        refill(kv, scale, 6)
        g.replay()
        torch.cuda.synchronize()
        assert kvb.read_row(m.rows[0]) == stored, "a revoked mirror wrote its rows"
        with pytest_raises(kvtier.UnavailableError):
            m.adopt([0, 1], ns.hash_tokens(list(range(2 * PAGE))))
        del g
        m.close()


class pytest_raises:
    """pytest.raises for both runners."""

    def __init__(self, cls):
        self.cls = cls

    def __enter__(self):
        return self

    def __exit__(self, cls, value, tb):
        if cls is None:
            raise AssertionError(f"{self.cls.__name__} was not raised")
        return issubclass(cls, self.cls)


SNAP_BYTES = 65536


def test_device_pool_lookup_restores_the_device_snapshot():
    need_cuda()
    flags = ["--device_pool_gpus=0", f"--device_pool_bytes={64 << 20}",
             f"--device_pool_row_bytes={1 << 20}"]
    torch.cuda.set_device(0)
    with kvtier.Daemon(flags=flags) as d, kvtier.Client(socket=d.socket) as c:
        kv = [torch.randn(8, PAGE, HEADS, DIM, device="cuda").to(torch.bfloat16)
              for _ in range(2)]
        snap = torch.randint(0, 256, (4, SNAP_BYTES), dtype=torch.uint8,
                             device="cuda")
        pool = kvtier.TorchPool({"kv": kv}, snapshot=[snap])
        ns = attach(c, "devpool", pool, snapshot_rows=4)
        infos = ns.device_pools
        assert len(infos) == 1 and ns.device_pools_valid
        info = infos[0]
        assert not info.withheld and len(info.ipc_handle) == 64
        assert info.rows == 64 and info.row_bytes >= SNAP_BYTES
        dp = ns.open_device_pool(0)
        assert dp.info == info
        dp.check()
        assert dp.slot(1) - dp.slot(0) == info.row_stride

        h = ns.hash_tokens(list(range(3 * PAGE)))
        res = ns.reserve(3, 1, device_snapshots=1, device_pool=0)
        [slot] = res.device_snapshot_rows
        xfer = ns.transfer(pool)
        xfer.evict([0, 1, 2], res.page_rows)
        xfer.save_snapshot(1, res.snapshot_rows[0])
        dp.save_snapshot(slot, snap[1])
        torch.cuda.synchronize()
        r = res.commit(h, snapshots=[(0, h[-1])], device_snapshots=[(0, h[-1])])
        assert (r.committed_pages, r.committed_snapshots) == (3, 1)
        # The daemon's memory through torch: the slot holds the state.
        assert torch.equal(dp.slot_tensor(slot, SNAP_BYTES), snap[1])
        whole = dp.tensor()
        assert whole.shape == (info.rows, info.row_bytes)
        assert torch.equal(whole[slot, :SNAP_BYTES], snap[1])
        # Mark the device copy, so a restore shows which tier it read.
        marked = snap[1].clone()
        marked[:64] ^= 0xFF
        whole[slot, :SNAP_BYTES].copy_(marked)
        torch.cuda.synchronize()

        dst = torch.zeros(SNAP_BYTES, dtype=torch.uint8, device="cuda")
        with ns.lookup(h, device_pool=0) as lease:
            assert lease.usable_pages == 3 and lease.has_snapshot
            assert lease.has_device_snapshot and lease.device_snapshot_row == slot
            dp.restore_snapshot(lease, dst)
            torch.cuda.synchronize()
        assert torch.equal(dst, marked)  # device-to-device, from the pool
        with ns.lookup(h) as host_only:
            assert host_only.has_snapshot and not host_only.has_device_snapshot
            dp.restore_snapshot(host_only, dst)
            torch.cuda.synchronize()
        assert torch.equal(dst, snap[1])  # from the host snapshot bank

        del whole
        d.stop()
        wait_until(lambda: not ns.device_pools_valid)
        with pytest_raises(kvtier.UnavailableError):
            dp.check()
        with pytest_raises(kvtier.UnavailableError):
            dp.slot(0)
        dp.close()


def _main(argv) -> int:
    if pytest is not None and "--plain" not in argv:
        return pytest.main(["-p", "no:cacheprovider", "-q", "-rs",
                            os.path.abspath(__file__)])
    skips = (Skipped,) + ((pytest.skip.Exception,) if pytest else ())
    passed = skipped = failed = 0
    for name, fn in list(globals().items()):
        if not name.startswith("test_") or not callable(fn):
            continue
        try:
            fn()
            passed += 1
            print(f"PASSED {name}", flush=True)
        except skips as e:
            skipped += 1
            print(f"SKIPPED {name}: {e}", flush=True)
        except Exception:
            failed += 1
            traceback.print_exc()
            print(f"FAILED {name}", flush=True)
    print(f"{passed} passed, {skipped} skipped, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
