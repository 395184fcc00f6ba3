"""The worker half of the kvtier vLLM connector, free of vLLM imports.

It maps vLLM's KV cache buffer onto the namespace's banks (layout.py), then
per engine step loads cached blocks into vLLM's blocks before the forward
pass and stores newly computed full blocks after it, all on the engine's
stream: CUDA buffers use libkvtier's CUDA backend on the current torch
stream, CPU buffers its reference copy (done before the call returns).
Nothing here waits on the daemon inside the forward pass: loads read rows
the scheduler pinned, stores reserve rows (one RPC) and commit once the
stream has finished the copies (CUDA: libkvtier's worker thread, never the
engine's).

Each namespace of the engine (its own and its tenants', tenants.py) has
its own banks, so its own transfer engine over the same buffer; a job
names its namespace (None: the engine's).

The GPU test (tests/gpu) drives this very class with CUDA tensors laid out
as vLLM lays them, so nothing here may import vLLM.

Thread-safety: one thread at a time (vLLM's model runner thread).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from ..client import Namespace, PendingCommit, PoolDescriptor, PoolTensorSpec
from ..errors import KvtierError
from .config import ConnectorConfig
from .stats import Counters
from .layout import CacheDescription
from .link import TierLink
from .tenants import TenantMap

log = logging.getLogger("kvtier.vllm")


@dataclasses.dataclass(frozen=True)
class LoadJob:
    """Copy rows[i] into vLLM block block_ids[i]; with a snapshot, the
    snapshot row into Mamba block snapshot_block."""
    req_id: str
    block_ids: tuple[int, ...]
    rows: tuple[int, ...]
    snapshot_block: int | None = None
    snapshot_row: int | None = None
    namespace: str | None = None  # None: the engine's namespace


@dataclasses.dataclass(frozen=True)
class StoreJob:
    """Store vLLM blocks block_ids (pages first_page.. of the request) under
    hashes, below `parent` (None: from the first page); with
    snapshot_block, the Mamba block holding the state after the last page."""
    req_id: str
    first_page: int
    block_ids: tuple[int, ...]
    hashes: tuple[bytes, ...]
    parent: bytes | None = None
    snapshot_block: int | None = None
    # The pages' token ids (config kv_event_tokens), for the daemon's KV
    # events; empty: none sent.
    token_ids: tuple[int, ...] = ()
    namespace: str | None = None  # None: the engine's namespace


@dataclasses.dataclass
class StepReport:
    """What the worker tells the scheduler after a step."""
    loaded: set[str] = dataclasses.field(default_factory=set)
    failed_loads: set[str] = dataclasses.field(default_factory=set)
    # (req_id, first_page, num_pages) of each committed store.
    stored: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    failed_stores: set[str] = dataclasses.field(default_factory=set)
    # The namespaces the worker can copy for (attached, with a transfer
    # engine): the scheduler reports no hits from the others.
    attached: frozenset[str] = frozenset()


@dataclasses.dataclass
class WorkerStats(Counters):
    load_blocks: int = 0
    load_bytes: int = 0
    load_seconds: float = 0.0
    store_blocks: int = 0
    store_bytes: int = 0
    store_seconds: float = 0.0
    load_failures: int = 0
    store_failures: int = 0


class KvtierWorker:
    """Loads and stores vLLM blocks through kvtier.

    Args:
      config, name, layout: see TierLink.
      cache: the engine's KV cache description (its layout).
    """

    def __init__(self, config: ConnectorConfig, name: str, layout, cache: CacheDescription,
                 instance: bytes | None = None):
        self.config = config
        self.cache = cache
        self.name = name
        self.regions = cache.regions()
        self.row_bytes = cache.row_bytes
        # Worker calls (Reserve, Commit) run after the forward pass, not in
        # the scheduler's path: a longer deadline than lookups.
        self.link = TierLink(config, name, layout, "worker", on_attach=self._attached,
                             timeout_ms=max(config.timeout_ms, 5000), instance=instance,
                             tenants=TenantMap.of(config, name))
        self.buffer = None
        self._xfers: dict[str, object] = {}  # namespace -> its Transfer
        # (commit, event after its copies, req_id, first page, pages)
        self._pending: list[tuple[PendingCommit, object, str, int, int]] = []
        # (event after the copies, loaded req_ids, failed req_ids)
        self._inflight_loads: list[tuple[object, set[str], set[str]]] = []
        self._report = StepReport()
        self.stats = WorkerStats()

    # -- setup ---------------------------------------------------------------

    def register(self, buffer) -> None:
        """Adopts vLLM's KV cache backing buffer (a uint8/int8 tensor over the
        whole allocation, CPU or CUDA). Raises ValueError when the buffer is
        smaller than the description says."""
        need = max(r.offset + (self.cache.num_blocks - 1) * r.stride + r.nbytes
                   for r in self.regions)
        have = buffer.numel() * buffer.element_size()
        if have < need:
            raise ValueError(f"KV cache buffer: {have} bytes, the layout places "
                             f"blocks up to byte {need}")
        self.buffer = buffer
        self.link.attach_all()  # a daemon that is down is retried later

    def descriptor(self) -> PoolDescriptor:
        """The pool descriptor of the registered buffer: one page bank "kv"
        whose row is block b of every region; for hybrid models the same
        regions as snapshot segments (slot = Mamba block id)."""
        b = self.buffer
        base = b.data_ptr()
        specs = tuple(PoolTensorSpec(base + r.offset, r.stride, r.nbytes)
                      for r in self.regions)
        cuda = b.device.type == "cuda"
        n = self.cache.num_blocks
        return PoolDescriptor(
            num_pages=n, banks=(("kv", specs),),
            snapshot=specs if self.cache.hybrid else (),
            num_snapshot_slots=n if self.cache.hybrid else 0,
            device=(b.device.index or 0) if cuda else 0,
            backend="cuda" if cuda else "reference", keepalive=(b,))

    def _attached(self, ns: Namespace) -> None:
        self._xfers[ns.name] = ns.transfer(self.descriptor())

    def _ready(self, name: str | None = None):
        """(Namespace, Transfer) of namespace `name` (None: the engine's), or
        None while the worker cannot copy for it."""
        if self.buffer is None:
            return None
        name = name or self.name
        ns = self.link.namespace(name)
        xfer = self._xfers.get(name)
        return (ns, xfer) if ns is not None and xfer is not None else None

    def _stream(self):
        if self.buffer is not None and self.buffer.device.type == "cuda":
            import torch
            return torch.cuda.current_stream(self.buffer.device)
        return None

    # -- per step --------------------------------------------------------------

    def load(self, jobs: list[LoadJob]) -> None:
        """Queues the copies of `jobs` on the current stream (CPU: copies
        now). Each request is reported exactly once, loaded or failed, and
        only after every copy queued for it has finished (a CUDA event), so
        its pin never goes while a copy may still read the rows. A job that
        fails is reported in failed_loads (vLLM then recomputes it or fails
        the request, as kv_load_failure_policy says)."""
        if not jobs:
            return
        stream = self._stream()
        t0 = time.perf_counter()
        ok: set[str] = set()
        failed: set[str] = set()
        for job in jobs:
            try:
                ready = self._ready(job.namespace)
                if ready is None:
                    raise KvtierError(14, "kvtier: not attached")
                if len(job.rows) != len(job.block_ids):
                    raise ValueError("the hit cannot be loaded as vLLM allocated it")
                xfer = ready[1]
                xfer.rehydrate(job.block_ids, job.rows, stream)
                if job.snapshot_block is not None:
                    xfer.restore_snapshot(job.snapshot_block, job.snapshot_row, stream)
                if self.config.fault == "corrupt-load" and job.block_ids:
                    self._corrupt(job.block_ids[0])
                self.stats.load_blocks += len(job.block_ids)
                self.stats.load_bytes += self.row_bytes * (
                    len(job.block_ids) + (job.snapshot_block is not None))
                ok.add(job.req_id)
            except (KvtierError, ValueError) as e:
                log.warning("kvtier: load of %d blocks for %s failed: %s",
                            len(job.block_ids), job.req_id, e)
                self.stats.load_failures += 1
                failed.add(job.req_id)
        if stream is None:
            self._report.loaded |= ok
            self._report.failed_loads |= failed
        else:
            import torch
            event = torch.cuda.Event()
            event.record(stream)
            self._inflight_loads.append((event, ok, failed))
        self.stats.load_seconds += time.perf_counter() - t0

    def _corrupt(self, block: int) -> None:
        """Test-only fault: perturbs every byte of `block` (see config)."""
        for r in self.regions:
            start = r.offset + block * r.stride
            view = self.buffer.view(-1)[start:start + r.nbytes]
            view.add_(1)

    def store(self, jobs: list[StoreJob]) -> None:
        """Reserves rows for `jobs`, queues the copies of their blocks after
        the work already on the current stream, and commits once it has
        finished. A job that cannot be stored (tier full, daemon down, its
        parent gone) is reported in failed_stores; nothing partial is ever
        visible."""
        if not jobs or self.config.store == "none":
            return
        stream = self._stream()
        t0 = time.perf_counter()
        for job in jobs:
            ready = self._ready(job.namespace)
            if ready is None:
                self._report.failed_stores.add(job.req_id)
                continue
            ns, xfer = ready
            snaps = 1 if job.snapshot_block is not None else 0
            res = None
            try:
                res = ns.reserve(len(job.block_ids), snaps)
                xfer.evict(job.block_ids, res.page_rows, stream)
                placements = []
                if snaps:
                    xfer.save_snapshot(job.snapshot_block, res.snapshot_rows[0], stream)
                    placements = [(0, job.hashes[-1])]
                if stream is None:
                    res.commit(job.hashes, parent=job.parent, snapshots=placements,
                               token_ids=job.token_ids or None)
                    self._report.stored.append((job.req_id, job.first_page,
                                                len(job.hashes)))
                else:
                    pending = res.commit_after(stream, job.hashes, parent=job.parent,
                                               snapshots=placements,
                                               token_ids=job.token_ids or None)
                    import torch
                    copied = torch.cuda.Event()
                    copied.record(stream)
                    self._pending.append((pending, copied, job.req_id, job.first_page,
                                          len(job.hashes)))
                res = None
                self.stats.store_blocks += len(job.block_ids)
                self.stats.store_bytes += self.row_bytes * (len(job.block_ids) + snaps)
            except (KvtierError, ValueError) as e:
                log.debug("kvtier: store of %d blocks for %s failed: %s",
                          len(job.block_ids), job.req_id, e)
                self.stats.store_failures += 1
                self._report.failed_stores.add(job.req_id)
            finally:
                if res is not None and not res.closed:
                    # Copies into the rows may be queued: the rows go back
                    # once the stream has run them, never before (and stay
                    # fenced should the daemon restart meanwhile).
                    res.abort(stream)
        self.stats.store_seconds += time.perf_counter() - t0

    def poll(self) -> StepReport:
        """What finished since the last poll: loads whose copies completed
        (their pins may go), commits, failures. Never blocks on the GPU; waits
        at most 1 ms for the oldest pending commit, and only once the GPU has
        finished its copies (the commit RPC may still be under way)."""
        still = []
        for event, ok, failed in self._inflight_loads:
            if still or not event.query():
                still.append((event, ok, failed))
            else:
                self._report.loaded |= ok
                self._report.failed_loads |= failed
        self._inflight_loads = still
        self._report.attached = frozenset(
            n for n in self.link.names if self._ready(n) is not None)
        while self._pending:
            pending, copied, req_id, first, n = self._pending[0]
            if not copied.query():
                break  # the GPU is still copying: the commit cannot be done
            try:
                pending.wait(timeout_ms=1)
            except KvtierError as e:
                if e.code == 4:  # DEADLINE_EXCEEDED: still queued
                    break
                self._report.failed_stores.add(req_id)
                self.stats.store_failures += 1
            else:
                self._report.stored.append((req_id, first, n))
            self._pending.pop(0)
        report, self._report = self._report, StepReport()
        return report

    def flush(self, timeout_ms: int = 10000) -> StepReport:
        """Waits for every queued load and commit (shutdown)."""
        if self._stream() is not None:
            for event, _, _ in self._inflight_loads:
                event.synchronize()
        for pending, _, req_id, first, n in self._pending:
            try:
                pending.wait(timeout_ms=timeout_ms)
                self._report.stored.append((req_id, first, n))
            except KvtierError:
                self._report.failed_stores.add(req_id)
        self._pending = []
        return self.poll()

    def close(self) -> None:
        self.flush()
        for xfer in self._xfers.values():
            xfer.close()
        self._xfers = {}
        self.link.close()
