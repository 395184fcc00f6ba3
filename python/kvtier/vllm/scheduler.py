"""The scheduler half of the kvtier vLLM connector: lookups, pins, and what
to store, in vLLM's own block hashes. Imports nothing from vLLM; requests
and block lists are duck-typed (request_id, block_hashes, num_tokens;
get_block_ids()).

- Lookups use `request.block_hashes`, vLLM's chained hashes (cache salt,
  LoRA and multimodal keys are inside them): page i of kvtier is vLLM block
  i, keyed by the hash that ends it. A hit is reported only for pages that
  can really be loaded (hybrid models: up to the deepest snapshot), never
  the prompt's last token, and is pinned by one lease per request until the
  worker has copied it (released at once when vLLM allocates nothing, on
  finish, abort and preemption; a second call for the same request drops
  the first lease). Every daemon call has the configured deadline; when in
  doubt the answer is a miss. With `cluster` the lookup also asks the
  daemon's cluster tier: when the request's prefix continues there (or a
  prefetch is already bringing it in) the scheduler starts one Prefetch for
  the request and answers None, vLLM's "ask again later", for as long as a
  prefetch is bringing pages in (at most cluster_wait_ms); then it answers
  from the local match, which the prefetch has grown, or not (a value that
  failed its checks is a miss). Loads are asynchronous in vLLM's sense: the
  request waits one step while the worker copies, so that everything vLLM
  does before a forward pass (the Mamba "align" state copies among them)
  sees the loaded blocks.
- Stores are write-through: each step, the full blocks a request completes
  in that step are handed to the worker, which copies them after the
  forward pass. No vLLM block is held beyond its request's own lifetime.
- Parallel engines (layout.Ranks): the scheduler's session is rank 0 of
  the namespace; one lookup answers for every rank (a page is a hit only
  where every rank committed it) and pins it for all of them. A load job
  carries the pages' chain so that the other ranks find their own rows
  (worker.py); a load or store counts once every rank reported it
  (tally.py).
- Tenants (tenants.py): a request's cache salt picks its namespace once,
  when it is first seen (the engine's own, a tenant's, or none: not
  cached); its lookups, loads and stores all go there.

Thread-safety: one thread at a time (vLLM's scheduler thread).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from ..errors import KvtierError
from .config import ConnectorConfig
from .data import LoadJob, StepReport, StoreJob
from .stats import Counters
from .layout import CacheDescription, Ranks
from .link import TierLink
from .tally import RankTally
from .tenants import TenantMap

log = logging.getLogger("kvtier.vllm")


@dataclasses.dataclass
class _Tracked:
    request: object
    # Its namespace (tenants.py), fixed when first seen; None: not cached.
    namespace: str | None = None
    stored_pages: int = 0  # pages [0, stored_pages) are in the tier or queued
    lease: object = None  # pinned hit awaiting allocation or the worker's copy
    local_tokens: int = 0  # vLLM's own hit when the lease was taken
    load_sent: bool = False
    finished: bool = False
    # With `cluster`: when this request's one prefetch stops being waited
    # for (time.monotonic()); None until it is started.
    prefetch_until: float | None = None
    failed_stores: int = 0  # stores of it that failed (on any rank)


@dataclasses.dataclass
class SchedulerStats(Counters):
    lookups: int = 0
    hit_tokens: int = 0
    miss_tokens: int = 0
    lookup_errors: int = 0
    lookups_skipped: int = 0  # misses while the namespace was not attached
    stores_skipped: int = 0  # steps whose new blocks were not stored: ditto
    prefetches: int = 0  # prefetches started (cluster)
    prefetch_waits: int = 0  # "ask again later" answers (cluster)
    prefetch_errors: int = 0
    unmapped_requests: int = 0  # cache salt in no tenant entry: not cached
    stores_given_up: int = 0  # requests whose stores failed STORE_ATTEMPTS times
    window_unstorable: int = 0  # requests whose sliding-window blocks were gone


# A request whose store failed this many times (a full tier, a rank that
# refuses) stores nothing more: each retry re-sends its whole chain.
STORE_ATTEMPTS = 2


@dataclasses.dataclass(frozen=True)
class StoredPages:
    """Pages the worker committed, for KV events."""
    req_id: str
    hashes: tuple[bytes, ...]
    parent: bytes | None
    token_ids: tuple[int, ...]


class KvtierScheduler:
    def __init__(self, config: ConnectorConfig, name: str, layout,
                 cache: CacheDescription, instance: bytes | None = None,
                 ranks: Ranks = Ranks(), background: bool = False):
        self.config = config
        self.cache = cache
        self.ranks = ranks
        self.bs = cache.block_size
        self.tenants = TenantMap.of(config, name)
        self.link = TierLink(config, name, layout, "scheduler", instance=instance,
                             tenants=self.tenants, warn_open=True,
                             background=background, on_attach=self._attached)
        self._skipped = [0, 0]  # lookups, stores skipped before an attach
        # What each rank reported: the namespaces every worker can copy for
        # (no hit is reported from another; the connector sets the first
        # guess), loads and stores done on every rank.
        self.tally = RankTally(ranks, self.tenants.namespaces)
        # A lookup that ran out of time makes lookups misses until then
        # (a slow daemon costs one deadline per retry_s, not one per request).
        self._pause_until = 0.0
        self._reqs: dict[str, _Tracked] = {}
        self._loads: list[LoadJob] = []
        self._stored_events: list[StoredPages] = []
        self.stats = SchedulerStats()

    # -- hashes ----------------------------------------------------------------

    def num_full_pages(self, request) -> int:
        """Full blocks of `request` whose hash vLLM has computed."""
        return len(request.block_hashes) // self.cache.hashes_per_block

    def page_hashes(self, request, num_pages: int | None = None,
                    start: int = 0) -> list[bytes]:
        """The kvtier keys of full blocks [start, num_pages): vLLM's hash at
        each block's end."""
        r = self.cache.hashes_per_block
        hashes = request.block_hashes
        n = self.num_full_pages(request)
        if num_pages is not None:
            n = min(n, num_pages)
        return [bytes(hashes[(i + 1) * r - 1]) for i in range(start, n)]

    def _track(self, request) -> _Tracked:
        """The request's record, made (and its namespace chosen by its cache
        salt) when it is first seen."""
        t = self._reqs.get(request.request_id)
        if t is None:
            name = self.tenants.route(getattr(request, "cache_salt", None))
            if name is None:
                self.stats.unmapped_requests += 1
            t = self._reqs[request.request_id] = _Tracked(request, name)
        return t

    # -- lookup ----------------------------------------------------------------

    def matched_tokens(self, request, num_computed_tokens: int) -> int | None:
        """External tokens beyond vLLM's own `num_computed_tokens` that the
        tier holds and that are now pinned for this request (0: a miss), or
        None (with `cluster` only) while a prefetch from the cluster tier is
        bringing more of the prefix in: ask again later."""
        t = self._track(request)
        self._drop_lease(t)
        if num_computed_tokens % self.bs or t.namespace is None:
            return 0
        max_pages = (request.num_tokens - 1) // self.bs
        if max_pages * self.bs <= num_computed_tokens:
            return 0
        if time.monotonic() < self._pause_until:
            return 0
        ns = self.link.namespace(t.namespace)
        if ns is None or t.namespace not in self.tally.ready:
            self.stats.lookups_skipped += 1
            self._skipped[0] += 1
            return 0
        hashes = self.page_hashes(request, max_pages)
        if len(hashes) * self.bs <= num_computed_tokens:
            return 0
        self.stats.lookups += 1
        t0 = time.monotonic()
        try:
            lease = ns.lookup(hashes, pin=True, remote=self.config.cluster)
            if (time.monotonic() - t0) * 1000 >= 0.9 * self.link.timeout_ms:
                # libkvtier answers a lookup that ran out of time with a
                # miss: a stalled daemon, so pause lookups for a while.
                self._pause_until = time.monotonic() + self.config.retry_s
        except KvtierError as e:
            self.stats.lookup_errors += 1
            if e.code in (4, 14):  # DEADLINE_EXCEEDED, UNAVAILABLE
                self._pause_until = time.monotonic() + self.config.retry_s
            log.debug("kvtier: lookup failed (%s): a miss", e)
            return 0
        usable = lease.usable_pages
        if self.cache.hybrid and not lease.has_snapshot:
            usable = 0
        # Pages the tier holds are not stored again.
        t.stored_pages = max(t.stored_pages, lease.matched_pages)
        if self.config.cluster and self._await_prefetch(
                t, ns, hashes, lease, num_computed_tokens):
            lease.release()
            self.stats.prefetch_waits += 1
            return None
        if usable * self.bs <= num_computed_tokens:
            self.stats.miss_tokens += len(hashes) * self.bs - num_computed_tokens
            lease.release()
            return 0
        t.lease, t.local_tokens, t.load_sent = lease, num_computed_tokens, False
        hit = usable * self.bs - num_computed_tokens
        self.stats.hit_tokens += hit
        self.stats.miss_tokens += max(0, len(hashes) * self.bs - usable * self.bs)
        return hit

    def _await_prefetch(self, t: _Tracked, ns, hashes: list[bytes], lease,
                        num_computed_tokens: int) -> bool:
        """Whether request `t` should wait for the cluster tier, given its
        remote lookup's `lease`: the first time the prefix continues there
        (or a prefetch already brings it in) beyond what vLLM holds, starts
        the request's one Prefetch; later, waits while a prefetch still
        brings pages in, up to cluster_wait_ms. Never waits again once that
        is over, so a prefetch that ends without the pages (a value that
        failed the daemon's checks, a full bank) leaves the local match."""
        ahead = max(lease.remote_pages, lease.prefetching_pages)
        if ahead == 0 or (lease.matched_pages + ahead) * self.bs <= num_computed_tokens:
            return False
        now = time.monotonic()
        if t.prefetch_until is None:
            t.prefetch_until = now + self.config.cluster_wait_ms / 1000
            try:
                r = ns.prefetch(hashes)
            except KvtierError as e:
                self.stats.prefetch_errors += 1
                t.prefetch_until = now
                log.debug("kvtier: prefetch failed (%s): the local match", e)
                return False
            self.stats.prefetches += 1
            # Nothing to come (the cluster tier lost the pages meanwhile)
            # unless this prefetch, a running one or one just finished
            # brings more than the lookup saw.
            return (r.remote_pages > 0 or r.prefetching_pages > 0
                    or r.local_pages > lease.matched_pages)
        return lease.prefetching_pages > 0 and now < t.prefetch_until

    def after_alloc(self, request, block_ids: tuple[list[int], ...],
                    num_external_tokens: int) -> None:
        """vLLM allocated the request's blocks (all of them, per group) and
        accepted `num_external_tokens` of the hit: queue the load, or drop
        the pin when nothing is to be loaded."""
        t = self._track(request)
        t.request = request
        lease = t.lease
        if lease is None or t.load_sent:
            return
        if num_external_tokens <= 0:
            self._drop_lease(t)
            return
        first = t.local_tokens // self.bs
        count = num_external_tokens // self.bs
        attn = block_ids[self.cache.attention_group]
        ok = (num_external_tokens % self.bs == 0 and first + count <= len(lease.rows)
              and first + count <= len(attn))
        snapshot_blocks, snapshot_row = (), None
        if ok and self.cache.hybrid:
            # The state after the last loaded page, one block per Mamba
            # group; only the deepest one is in the lease, so vLLM must take
            # the whole hit.
            end = first + count
            ok = end == lease.usable_pages and lease.has_snapshot
            snapshot_blocks = self._state_blocks(block_ids, end) if ok else None
            ok = snapshot_blocks is not None
            snapshot_row = lease.snapshot_row
        group_blocks = ()
        if ok and self.cache.sliding_groups:
            group_blocks = self._window_blocks(block_ids, first, first + count)
            ok = group_blocks is not None
        if not ok:
            # Cannot be loaded as vLLM took it: have vLLM recompute the lot.
            log.warning("kvtier: cannot load %d tokens of %s as allocated; "
                        "recomputing", num_external_tokens, request.request_id)
            block = attn[first:first + max(count, 1)]
            self._loads.append(LoadJob(request.request_id, tuple(block), (),
                                       namespace=t.namespace))
        else:
            # Ranks other than 0 find their rows from the chain (worker.py).
            chain = () if self.ranks.world == 1 or self.ranks.replicated else \
                tuple(self.page_hashes(request, first + count))
            self._loads.append(LoadJob(
                request.request_id, tuple(attn[first:first + count]),
                tuple(lease.rows[first:first + count]), snapshot_blocks, snapshot_row,
                namespace=t.namespace, first_page=first, hashes=chain,
                group_blocks=group_blocks))
        t.load_sent = True

    def _window_blocks(self, block_ids, first: int, end: int):
        """Per sliding-window group, its blocks of pages [first, end) that a
        resume at page `end` needs (its window's pages; 0 for the others,
        not loaded), or None when vLLM gave one of those no block."""
        out = []
        for g in self.cache.sliding_groups:
            blocks = block_ids[g]
            need = max(first, end - self.cache.window_pages(g))
            row = []
            for i in range(first, end):
                block = blocks[i] if i < len(blocks) else 0
                if i >= need and block == 0:
                    return None
                row.append(block if i >= need else 0)
            out.append(tuple(row))
        return tuple(out)

    def _live_blocks(self, block_ids, first: int, end: int):
        """Per sliding-window group, its blocks of pages [first, end), or
        None when vLLM no longer holds one of them (outside the window)."""
        out = []
        for g in self.cache.sliding_groups:
            blocks = tuple(block_ids[g][first:end])
            if len(blocks) < end - first or 0 in blocks:
                return None
            out.append(blocks)
        return tuple(out)

    def _state_blocks(self, block_ids, pages: int) -> tuple[int, ...] | None:
        """Each Mamba group's block holding its state after page `pages`-1,
        in group order (the snapshot row's order), or None where a group
        has none there (vLLM's null block 0, or no block yet)."""
        out = []
        for g in self.cache.mamba_groups:
            blocks = block_ids[g]
            if pages < 1 or pages > len(blocks) or blocks[pages - 1] == 0:
                return None
            out.append(blocks[pages - 1])
        return tuple(out)

    def take_loads(self) -> list[LoadJob]:
        loads, self._loads = self._loads, []
        return loads

    # -- store -----------------------------------------------------------------

    def has_new_pages(self, req_id: str, computed_after: int) -> bool:
        """Whether request `req_id` completes a block not yet stored by the
        end of this step: checked before plan_store so that most decode
        steps cost neither a block-table read nor hashing."""
        t = self._reqs.get(req_id)
        new = (t is not None and not t.finished and self.config.store != "none"
               and t.failed_stores < STORE_ATTEMPTS and t.namespace is not None
               and min(computed_after // self.bs,
                       self.num_full_pages(t.request)) > t.stored_pages)
        if new and not self.link.attached_to(t.namespace):
            self.stats.stores_skipped += 1  # a later miss
            self._skipped[1] += 1
            return False
        return new

    def plan_store(self, req_id: str, computed_after: int,
                   block_ids: tuple[list[int], ...]) -> StoreJob | None:
        """The store job for the full blocks request `req_id` has computed by
        the end of this step (`computed_after` tokens), or None."""
        t = self._reqs.get(req_id)
        if t is None or t.finished or self.config.store == "none":
            return None
        if t.failed_stores >= STORE_ATTEMPTS:
            return None
        if t.namespace is None or not self.link.attached_to(t.namespace):
            return None
        attn = block_ids[self.cache.attention_group]
        first = t.stored_pages
        full = min(computed_after // self.bs, len(attn), self.num_full_pages(t.request))
        if full <= first:
            return None  # the common decode step: nothing new, nothing hashed
        new = attn[first:full]
        if 0 in new:
            # vLLM's null block stands in for a block the request no longer
            # holds: never store it under a real hash.
            full = first + new.index(0)
            if full <= first:
                return None
        # The new pages' hashes and their parent's.
        hashes = self.page_hashes(t.request, full, start=max(first - 1, 0))
        parent = hashes[0] if first else None
        new_hashes = hashes[1:] if first else hashes
        snapshot_blocks = ()
        if self.cache.hybrid:
            # The recurrent state is kept only where the step ends on the
            # page boundary (vLLM's "align" mode schedules prefill chunks so).
            snapshot_blocks = self._state_blocks(block_ids, full)
            if computed_after != full * self.bs or snapshot_blocks is None:
                return None
        group_blocks = ()
        if self.cache.sliding_groups:
            # A page is stored with its sliding-window blocks or not at all:
            # those vLLM dropped (outside the window) cannot be had, and
            # every later page chains on this one.
            group_blocks = self._live_blocks(block_ids, first, full)
            if group_blocks is None:
                self.stats.window_unstorable += 1
                t.failed_stores = STORE_ATTEMPTS
                return None
        tokens = ()
        if self.config.kv_event_tokens:
            tokens = tuple(int(x) for x in
                           t.request.all_token_ids[first * self.bs:full * self.bs])
        job = StoreJob(req_id, first, tuple(attn[first:full]), tuple(new_hashes),
                       parent, snapshot_blocks, tokens, namespace=t.namespace,
                       group_blocks=group_blocks)
        t.stored_pages = full
        return job

    # -- worker reports ----------------------------------------------------------

    def _attached(self, ns) -> None:
        if any(self._skipped):
            log.info("kvtier: scheduler attached %r after %d lookups and %d "
                     "stores were skipped", ns.name, *self._skipped)
            self._skipped = [0, 0]

    @property
    def worker_ready(self) -> set[str]:
        """The namespaces every worker can copy for."""
        return self.tally.ready

    @worker_ready.setter
    def worker_ready(self, names) -> None:
        """The first guess, until every rank has reported."""
        self.tally.set_first_ready(names)

    def on_report(self, report: StepReport) -> None:
        """One rank's report of a step: release pins of loads every rank
        finished, re-store requests whose store failed on a rank, record
        pages every storing rank committed."""
        loads_done, failed, stored = self.tally.add(report)
        self.loads_done(loads_done)
        for req_id in failed:
            t = self._reqs.get(req_id)
            if t is not None:
                t.stored_pages = 0  # the chain may be broken: from the start
                t.failed_stores += 1
                if t.failed_stores == STORE_ATTEMPTS:
                    self.stats.stores_given_up += 1
        for req_id, first, n in stored:
            t = self._reqs.get(req_id)
            if t is None:
                continue
            hashes = self.page_hashes(t.request, first + n, start=max(first - 1, 0))
            parent = hashes[0] if first else None
            tokens = tuple(getattr(t.request, "all_token_ids", ())[first * self.bs:
                                                                   (first + n) * self.bs])
            self._stored_events.append(StoredPages(
                req_id, tuple(hashes[1:] if first else hashes), parent, tokens))

    def loads_done(self, req_ids) -> None:
        """The worker finished (or failed) copying these requests' hits: their
        pins go."""
        for req_id in req_ids:
            t = self._reqs.get(req_id)
            if t is not None and t.load_sent:
                self._drop_lease(t)
                self._forget_if_done(req_id, t)

    def take_stored(self) -> list[StoredPages]:
        out, self._stored_events = self._stored_events, []
        return out

    # -- lifetime ----------------------------------------------------------------

    def finished(self, req_id: str) -> None:
        """The request finished, was aborted or preempted for good. A pin
        whose load was sent stays until the worker reports the copy done;
        the rest of what is kept for it (its prefetch among it) goes."""
        t = self._reqs.get(req_id)
        if t is None:
            return
        t.finished = True
        if not t.load_sent:
            self._drop_lease(t)
        self._forget_if_done(req_id, t)

    def preempted(self, req_id: str) -> None:
        """The request lost its blocks: what it stores restarts at the tier's
        state, found again by the next lookup."""
        t = self._reqs.get(req_id)
        if t is not None and not t.load_sent:
            self._drop_lease(t)

    def _forget_if_done(self, req_id: str, t: _Tracked) -> None:
        if t.finished and t.lease is None:
            self._reqs.pop(req_id, None)

    def _drop_lease(self, t: _Tracked) -> None:
        if t.lease is not None:
            try:
                t.lease.release()
            except KvtierError as e:  # the session is gone: so is the pin
                log.debug("kvtier: release: %s", e)
            t.lease = None
        t.load_sent = False

    @property
    def num_pinned(self) -> int:
        return sum(1 for t in self._reqs.values() if t.lease is not None)

    def close(self) -> None:
        for t in self._reqs.values():
            self._drop_lease(t)
        self._reqs.clear()
        self.link.close()
