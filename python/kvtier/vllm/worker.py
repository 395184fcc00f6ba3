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

Parallel engines (layout.Ranks): every TP x PP worker is a rank of the
namespace and copies its own shard. The scheduler's lookup (a session of
rank 0) pins the pages for every rank, but answers rank 0's rows only;
a worker of another rank finds its own rows of the same pages by looking
the job's hash chain up on its own session, unpinned, bound to the
scheduler's lease: pinned pages cannot be evicted, so the chain finds the
very pages the lease holds, and a worker that finds fewer than the job
needs fails the load (a recompute, never a partial or wrong page). One
fast binary lookup per load and rank, no change to what the daemon pins,
and no rows of all ranks in every lookup answer (see docs/vllm.md). Each
rank stores its shard under the same hashes with reservations of its own;
the scheduler counts a load or store done only once every rank reported
it (StepReport.rank).

The GPU test (tests/gpu) drives this very class with CUDA tensors laid out
as vLLM lays them, so nothing here may import vLLM.

Thread-safety: one thread at a time (vLLM's model runner thread).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

from ..client import Namespace, PendingCommit, PoolDescriptor, PoolTensorSpec
from ..errors import KvtierError
from .config import ConnectorConfig
# The jobs and the report are re-exported: tests import them from here.
from .data import LoadJob, StepReport, StoreJob  # noqa: F401
from .stats import Counters
from .layout import CacheDescription, Ranks
from .link import TierLink
from .tenants import TenantMap

log = logging.getLogger("kvtier.vllm")


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
    rank_lookups: int = 0  # this rank's rows found for a load (rank > 0)
    stores_skipped: int = 0  # store jobs while the namespace was not attached


class KvtierWorker:
    """Loads and stores vLLM blocks through kvtier.

    Args:
      config, name, layout: see TierLink.
      cache: the engine's KV cache description (its layout).
      ranks, rank: the engine's workers as namespace ranks, and this one's.
    """

    def __init__(self, config: ConnectorConfig, name: str, layout, cache: CacheDescription,
                 instance: bytes | None = None, ranks: Ranks = Ranks(), rank: int = 0,
                 background: bool = False):
        if not 0 <= rank < ranks.world:
            raise ValueError(f"rank {rank} is outside the engine's {ranks.world}")
        self.config = config
        self.cache = cache
        self.name = name
        self.ranks = ranks
        self.rank = rank
        self.regions = cache.regions()
        self.row_bytes = cache.row_bytes
        # Worker calls (Reserve, Commit) run after the forward pass, not in
        # the scheduler's path: a longer deadline than lookups.
        self.link = TierLink(config, name, layout, "worker", on_attach=self._attached,
                             timeout_ms=max(config.timeout_ms, 5000), instance=instance,
                             tenants=TenantMap.of(config, name), tp_rank=rank,
                             background=background)
        self.buffer = None
        self._xfers: dict[str, object] = {}  # namespace -> its Transfer
        # (commit, event after its copies, req_id, first page, pages)
        self._pending: list[tuple[PendingCommit, object, str, int, int]] = []
        # (event after the copies, loaded req_ids, failed req_ids)
        self._inflight_loads: list[tuple[object, set[str], set[str]]] = []
        self._report = StepReport(rank=rank)
        self.stats = WorkerStats()
        self._loads_seen = 0  # load jobs taken (the corrupt-load test fault)
        self._skipped = 0  # store jobs skipped since the last attach

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
        # A daemon that is down is retried later; in the background, one
        # that is slow attaches after vLLM has started.
        self.link.attach_all(wait_s=self.link.timeout_ms / 1000)

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
        if self._skipped:
            log.info("kvtier: worker rank %d attached %r after %d stores were "
                     "skipped", self.rank, ns.name, self._skipped)
            self._skipped = 0

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
                rows, snapshot_row = self._rows_of(ready[0], job)
                xfer = ready[1]
                xfer.rehydrate(*self._group_rows(job.block_ids, job.group_blocks, rows),
                               stream)
                if job.snapshot_blocks:
                    xfer.restore_snapshots(job.snapshot_blocks, snapshot_row, stream)
                self._loads_seen += 1
                if (self.config.fault.on("corrupt-load", self.rank) and job.block_ids
                        and self._loads_seen >= self.config.fault.page):
                    self._corrupt(job.block_ids[0])
                self.stats.load_blocks += len(job.block_ids)
                self.stats.load_bytes += self.row_bytes * (
                    len(job.block_ids) + len(job.snapshot_blocks))
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

    def _rows_of(self, ns: Namespace, job: LoadJob):
        """(page rows, snapshot row) of `job` in this rank's banks: the job's
        own (rank 0's) where they are this rank's too, else found by an
        unpinned lookup of the job's chain, which the scheduler's lease
        keeps in place. Raises ValueError when this rank's banks do not
        hold what the job loads (a load failure: recomputed)."""
        if self.ranks.own_rows(self.rank):
            return job.rows, job.snapshot_row
        end = job.first_page + len(job.block_ids)
        if len(job.hashes) != end:
            raise ValueError(f"rank {self.rank}: the load names {len(job.hashes)} "
                             f"hashes for {end} pages")
        lease = ns.lookup(list(job.hashes), pin=False)
        try:
            self.stats.rank_lookups += 1
            if lease.usable_pages < end or (
                    job.snapshot_blocks
                    and (lease.usable_pages != end or not lease.has_snapshot)):
                raise ValueError(f"rank {self.rank} holds {lease.usable_pages} of "
                                 f"the {end} pages the scheduler leased")
            return tuple(lease.rows[job.first_page:end]), lease.snapshot_row
        finally:
            lease.release()

    def _group_rows(self, blocks, group_blocks, rows):
        """(pool pages, row indices) of pages `blocks` in `rows` with their
        sliding-window groups' blocks: libkvtier addresses group g of row r
        as r * page_groups + g; group blocks 0 are skipped."""
        k = self.cache.page_groups
        if k == 1:
            return list(blocks), list(rows)
        pages, out = [], []
        for i, (block, row) in enumerate(zip(blocks, rows)):
            pages.append(block)
            out.append(row * k)
            for g, per_page in enumerate(group_blocks):
                if per_page[i]:
                    pages.append(per_page[i])
                    out.append(row * k + 1 + g)
        return pages, out

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
        if not jobs or self.config.store == "none" or not self.ranks.stores(self.rank):
            return
        stream = self._stream()
        t0 = time.perf_counter()
        for job in jobs:
            ready = self._ready(job.namespace)
            if ready is None:
                self.stats.stores_skipped += 1
                self._skipped += 1
                self._report.failed_stores.add((job.req_id, job.first_page))
                continue
            ns, xfer = ready
            snaps = 1 if job.snapshot_blocks else 0
            res = None
            try:
                fault = self.config.fault
                if (fault.on("refuse-store", self.rank)
                        and job.first_page + len(job.block_ids) > fault.page):
                    raise KvtierError(8, "kvtier: test fault refuse-store")
                res = ns.reserve(len(job.block_ids), snaps)
                xfer.evict(*self._group_rows(job.block_ids, job.group_blocks,
                                             res.page_rows), stream)
                if fault.on("hang-store", self.rank) and os.path.exists(fault.path + ".go"):
                    open(fault.path, "w").close()
                    while True:  # until the test kills this process
                        time.sleep(1)
                placements = []
                if snaps:
                    xfer.save_snapshots(job.snapshot_blocks, res.snapshot_rows[0], stream)
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
                self.stats.store_bytes += self.row_bytes * (len(job.block_ids)
                                                            + len(job.snapshot_blocks))
            except (KvtierError, ValueError) as e:
                log.debug("kvtier: store of %d blocks for %s failed: %s",
                          len(job.block_ids), job.req_id, e)
                self.stats.store_failures += 1
                self._report.failed_stores.add((job.req_id, job.first_page))
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
                self._report.failed_stores.add((req_id, first))
                self.stats.store_failures += 1
            else:
                self._report.stored.append((req_id, first, n))
            self._pending.pop(0)
        report, self._report = self._report, StepReport(rank=self.rank)
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
                self._report.failed_stores.add((req_id, first))
        self._pending = []
        return self.poll()

    def close(self) -> None:
        self.flush()
        for xfer in self._xfers.values():
            xfer.close()
        self._xfers = {}
        self.link.close()
