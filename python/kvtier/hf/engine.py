"""PrefixCachingEngine, the transformers integration's minimal paged
serving loop around a transformers model, the shape an engine integration
takes:
  - a paged KV pool (pool.py) that is the engine's own prefix cache, LRU
    over pages, plus a tiny pool of snapshot slots for hybrid models;
  - chunked prefill (chunk boundaries at multiples of chunk_tokens, each a
    multiple of the page size); after each chunk the chunk's full pages go
    into the pool and, written through, into kvtier, together with a
    snapshot of the recurrent state at the boundary (hybrid models), all
    committed once the stream has finished the copies (commit_after);
  - admission: the longest usable prefix of a request (all but its last
    token, which is always computed) comes from the GPU pool, or when kvtier
    has more of it, is rehydrated from kvtier into free pool pages on the
    current stream (and the snapshot into a slot); then a DynamicCache is built
    from those pages and only the rest of the prompt is computed.

Bit-exactness: restoring copies bytes; the logits of the computed part equal
those of an uninterrupted run that used the same chunk boundaries (compare
like with like: a different chunk schedule rounds differently).

Thread-safety: an engine serves one request at a time (not thread-safe).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import torch

from .. import client as kvclient
from ..errors import KvtierError
from .model import forward, new_cache, probe_state_spec
from .pool import PagedKVPool, _Lru


@dataclasses.dataclass
class PrefillResult:
    """What one request did. Token counts are prompt positions."""
    logits: torch.Tensor            # [computed, vocab] (keep_all) or [1, vocab]
    prompt_tokens: int
    resume_tokens: int              # prefix not computed (restored)
    computed_tokens: int
    gpu_hit_tokens: int             # restored from the engine's pool
    tier_hit_tokens: int            # rehydrated from kvtier
    tier_matched_pages: int = 0
    tier_usable_pages: int = 0
    snapshot_from_tier: bool = False
    rehydrated_bytes: int = 0
    stored_pages: int = 0
    stored_snapshots: int = 0
    pieces: list = dataclasses.field(default_factory=list)
    commits: list = dataclasses.field(default_factory=list)
    commit_errors: list = dataclasses.field(default_factory=list)
    _rehydrate_timer: object = None

    @property
    def rehydrate_seconds(self) -> float | None:
        """Time the rehydration copies took (CUDA events on the stream, or
        wall time on the CPU); None when nothing was rehydrated."""
        t = self._rehydrate_timer
        if t is None:
            return None
        if isinstance(t, float):
            return t
        start, end = t
        end.synchronize()
        return start.elapsed_time(end) / 1e3


class PrefixCachingEngine:
    """A paged prefix cache for a transformers model with kvtier below it.

    Args:
      model: a causal LM whose cache is a DynamicCache (see probe_state_spec).
      client: a kvtier.Client; the engine attaches namespace `name`.
      name: the namespace; engines share prefixes only within one name, so it
        must identify the model and its weights.
      tokens_per_page, chunk_tokens: page size and prefill chunk (a multiple
        of the page size); both are part of what makes results comparable.
      pool_pages, snapshot_slots: the engine's own cache on the model's device.
      page_rows, snapshot_rows, max_replay_tokens: namespace size when this
        attach creates it (0: daemon defaults).
      max_ctas: most CTAs per copy launch (0: libkvtier's default).
    """

    def __init__(self, model, client: kvclient.Client, name: str, *,
                 tokens_per_page: int = 16, chunk_tokens: int = 256,
                 pool_pages: int = 1024, snapshot_slots: int = 4,
                 page_rows: int = 0, snapshot_rows: int = 0,
                 max_replay_tokens: int = 0, max_ctas: int = 0,
                 hash_kind: str = "sha256"):
        if chunk_tokens <= 0 or chunk_tokens % tokens_per_page:
            raise ValueError(f"chunk_tokens: {chunk_tokens} is not a positive "
                             f"multiple of tokens_per_page ({tokens_per_page})")
        self.model = model
        self.device = next(model.parameters()).device
        self.spec = probe_state_spec(model)
        self.tokens_per_page = tokens_per_page
        self.chunk_tokens = chunk_tokens
        self.pool = PagedKVPool(self.spec, num_pages=pool_pages,
                                tokens_per_page=tokens_per_page,
                                snapshot_slots=snapshot_slots, device=self.device)
        layout = self.pool.torch_pool.layout(
            tokens_per_page=tokens_per_page, num_layers=self.spec.num_layers,
            model=name, hash_kind=hash_kind)
        hybrid = self.spec.hybrid
        self.ns = client.attach(name, layout, page_rows=page_rows,
                                snapshot_rows=snapshot_rows if hybrid else 0,
                                max_replay_tokens=max_replay_tokens if hybrid else 0)
        self.xfer = self.ns.transfer(self.pool.torch_pool, max_ctas=max_ctas)
        self._pages = _Lru(pool_pages)
        self._slots = _Lru(self.pool.num_slots)

    # ---------------------------------------------------------------- state

    def _stream(self):
        return torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None

    def clear_gpu_cache(self) -> None:
        """Forgets every page and snapshot held in the engine's pool (as if
        other requests had evicted them); kvtier keeps its copies."""
        self._pages.clear()
        self._slots.clear()

    def gpu_resident_pages(self, tokens) -> int:
        """How many leading full pages of `tokens` the engine's pool holds."""
        hashes = self.ns.hash_tokens(tokens)
        n = 0
        while n < len(hashes) and self._pages.get(hashes[n]) is not None:
            n += 1
        return n

    def build_cache(self, pages: Sequence[int], slot: int | None):
        """A DynamicCache holding pool pages `pages` (tokens [0, len*P)) and,
        for hybrid models, the states of snapshot slot `slot`."""
        cache = new_cache(self.model)
        if pages:
            for li, (k, v) in zip(self.spec.attn_layers, self.pool.read_pages(pages)):
                cache.layers[li].update(k, v)
        if slot is not None:
            for seg, t in zip(self.spec.states, self.pool.read_states(slot)):
                layer = cache.layers[seg.layer]
                if seg.kind == "conv":
                    layer.lazy_initialization(conv_states=t, state_idx=seg.index,
                                              conv_kernel_size=t.shape[-1])
                    layer.conv_states[seg.index].copy_(t)
                else:
                    layer.lazy_initialization(recurrent_states=t, state_idx=seg.index)
                    layer.recurrent_states[seg.index].copy_(t)
                layer.has_previous_state[seg.index] = True
        return cache

    # -------------------------------------------------------------- request

    def schedule(self, start: int, end: int, extra_boundaries=()) -> list[tuple[int, int]]:
        """The prefill pieces of positions [start, end): cut at multiples of
        chunk_tokens and at `extra_boundaries`."""
        cuts = {b for b in extra_boundaries if start < b < end}
        c = (start // self.chunk_tokens + 1) * self.chunk_tokens
        while c < end:
            cuts.add(c)
            c += self.chunk_tokens
        points = [start, *sorted(cuts), end]
        return [(a, b) for a, b in zip(points, points[1:])]

    @torch.no_grad()
    def prefill(self, tokens, *, use_gpu_cache: bool = True, use_tier: bool = True,
                store: bool = True, keep_all: bool = False,
                extra_boundaries=()) -> PrefillResult:
        """Serves the prompt `tokens` up to its first output token's logits.

        use_gpu_cache / use_tier: where a cached prefix may come from.
        store: put the computed full pages (and snapshots at page-aligned
          chunk boundaries) into the pool and kvtier.
        keep_all: return logits of every computed position (else the last).
        extra_boundaries: more chunk cuts, to reproduce another run's schedule.
        Returns once the logits are computed and the commits are done.
        """
        tokens = [int(t) for t in (tokens.tolist() if hasattr(tokens, "tolist") else tokens)]
        total = len(tokens)
        if total < 1:
            raise ValueError("tokens: empty prompt")
        p = self.tokens_per_page
        hashes = self.ns.hash_tokens(tokens)  # every full page
        usable = hashes[:(total - 1) // p]    # the last token is always computed
        stream = self._stream()
        result = PrefillResult(logits=None, prompt_tokens=total, resume_tokens=0,
                               computed_tokens=0, gpu_hit_tokens=0, tier_hit_tokens=0)

        # The engine's own pool first.
        g = 0
        if use_gpu_cache:
            while g < len(usable) and self._pages.get(usable[g]) is not None:
                g += 1
            if self.spec.hybrid:
                while g > 0 and self._slots.get(usable[g - 1]) is None:
                    g -= 1
        resume_pages, slot = g, (self._slots.get(usable[g - 1]) if g and self.spec.hybrid else None)

        # kvtier when it has more.
        if use_tier and usable:
            lease = self.ns.lookup(usable, pin=True)
            result.tier_matched_pages = lease.matched_pages
            result.tier_usable_pages = lease.usable_pages
            if lease.usable_pages > g:
                resume_pages = lease.usable_pages
                protect = set(usable[:resume_pages])
                missing = [i for i in range(resume_pages)
                           if not use_gpu_cache or self._pages.get(usable[i]) is None]
                ids = self._pages.alloc(len(missing), protect)
                timer = self._start_timer()
                self.xfer.rehydrate(ids, [lease.rows[i] for i in missing], stream)
                for i, ident in zip(missing, ids):
                    self._pages.put(usable[i], ident)
                if self.spec.hybrid:
                    slot = self._slots.alloc(1, protect)[0]
                    self.xfer.restore_snapshot(slot, lease.snapshot_row, stream)
                    self._slots.put(usable[resume_pages - 1], slot)
                    result.snapshot_from_tier = True
                result._rehydrate_timer = self._stop_timer(timer)
                result.tier_hit_tokens = len(missing) * p
                result.rehydrated_bytes = len(missing) * self.pool.page_bytes + (
                    self.pool.torch_pool.snapshot_row_bytes if self.spec.hybrid else 0)
            lease.release(stream)
        result.gpu_hit_tokens = resume_pages * p - result.tier_hit_tokens

        restored = usable[:resume_pages]
        self._pages.touch(restored)
        cache = self.build_cache([self._pages.get(h) for h in restored],
                                 slot if resume_pages else None)
        start = resume_pages * p
        result.resume_tokens = start
        result.computed_tokens = total - start

        pendings, logits = [], []
        ids_t = torch.tensor(tokens, dtype=torch.long, device=self.device)
        for a, b in self.schedule(start, total, extra_boundaries):
            out = forward(self.model, ids_t[a:b], cache, keep_all)
            logits.append(out if keep_all or b == total else None)
            result.pieces.append((a, b))
            if store:
                pendings.extend(self._store(cache, hashes, a, b, use_tier, stream, result))
        result.logits = torch.cat(logits) if keep_all else logits[-1]
        # The whole prompt's pages, deepest first: its prefix ends up most
        # recent, so the pool evicts a sequence from its end.
        self._pages.touch(hashes)
        for pending in pendings:
            # A failed write-through (say the parent page was evicted from
            # kvtier meanwhile) costs a later request a recompute, not this
            # request its answer.
            try:
                result.commits.append(pending.wait())
            except KvtierError as e:
                result.commit_errors.append(str(e))
        return result

    def _start_timer(self):
        if self.device.type == "cuda":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _stop_timer(self, start):
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            return (start, end)
        return time.perf_counter() - start

    def _store(self, cache, hashes, a, b, use_tier, stream, result):
        """Puts the full pages of piece [a, b) into the pool (and kvtier), with
        a snapshot at b when b is page aligned (hybrid). Returns the pending
        commits."""
        p = self.tokens_per_page
        first, last = a // p, b // p
        if last <= first:
            return []
        keys = hashes[first:last]
        protect = set(keys)
        new = [i for i, h in enumerate(keys) if self._pages.get(h) is None]
        ids = self._pages.alloc(len(new), protect)
        for i, ident in zip(new, ids):
            self._pages.put(keys[i], ident)
        # Pages already in the pool came from the same tokens: skip the copy.
        runs = _runs(new)
        for lo, hi in runs:
            self.pool.write_pages(cache, (first + lo) * p,
                                  [self._pages.get(keys[i]) for i in range(lo, hi)])
        snap = self.spec.hybrid and b % p == 0
        slot = None
        if snap:
            slot = self._slots.alloc(1, {keys[-1]})[0]
            self.pool.write_states(cache, slot)
            self._slots.put(keys[-1], slot)
        self._pages.touch(keys)
        result.stored_pages += len(keys)
        result.stored_snapshots += int(snap)
        if not use_tier:
            return []
        res = self.ns.reserve(len(keys), 1 if snap else 0)
        try:
            self.xfer.evict([self._pages.get(h) for h in keys], res.page_rows, stream)
            if snap:
                self.xfer.save_snapshot(slot, res.snapshot_rows[0], stream)
        except Exception:
            res.abort()
            raise
        return [res.commit_after(stream, keys, parent=hashes[first - 1] if first else None,
                                 snapshots=[(0, keys[-1])] if snap else ())]


def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted ints as maximal runs [lo, hi) of consecutive values."""
    out = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out
