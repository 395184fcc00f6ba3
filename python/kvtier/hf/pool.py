"""The engine's own cache on the model's device (transformers
integration): PagedKVPool, per attention layer K and V tensors [pages,
page_size, kv_heads, head_dim] plus a pool of snapshot slots (per linear
layer conv and recurrent state) for hybrid models, with the copies between
them and a DynamicCache; and _Lru, the least-recently-used map of page
hashes to pool pages (and of snapshots to slots) the engine keeps over it.

Thread-safety: one thread at a time (the engine's); copies run on the
current stream.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import torch

from ..torch_pool import TorchPool
from .model import StateSpec


def _slot_tensor(slots: int, shape: tuple[int, ...], dtype, device) -> torch.Tensor:
    """A [slots, *shape] view whose slots start 16 bytes apart at least (the
    copy kernel moves 16-byte vectors)."""
    n = 1
    for s in shape:
        n *= s
    es = torch.empty((), dtype=dtype).element_size()
    per = -(-n * es // 16) * 16 // es if (16 % es == 0) else n
    buf = torch.zeros(slots, per, dtype=dtype, device=device)
    return buf[:, :n].view(slots, *shape)


class PagedKVPool:
    """The engine's paged KV pool and snapshot slots, and the copies between
    them and a DynamicCache (on the current stream)."""

    def __init__(self, spec: StateSpec, *, num_pages: int, tokens_per_page: int,
                 snapshot_slots: int, device):
        self.spec = spec
        self.tokens_per_page = tokens_per_page
        self.num_pages = num_pages
        shape = (num_pages, tokens_per_page, spec.kv_heads, spec.head_dim)
        self.k = [torch.zeros(shape, dtype=spec.kv_dtype, device=device)
                  for _ in spec.attn_layers]
        self.v = [torch.zeros(shape, dtype=spec.kv_dtype, device=device)
                  for _ in spec.attn_layers]
        self.num_slots = snapshot_slots if spec.hybrid else 0
        self.states = [_slot_tensor(self.num_slots, s.shape, s.dtype, device)
                       for s in spec.states] if spec.hybrid else []
        kv = [t for pair in zip(self.k, self.v) for t in pair]
        self.torch_pool = TorchPool({"kv": kv}, snapshot=self.states)
        self.page_bytes = self.torch_pool.row_bytes("kv")

    def write_pages(self, cache, first_token: int, pages: Sequence[int]) -> None:
        """Copies tokens [first_token, first_token + len(pages)*P) of every
        attention layer of `cache` into pool pages `pages`."""
        if not pages:
            return
        p, n = self.tokens_per_page, len(pages)
        idx = torch.tensor(pages, dtype=torch.long, device=self.k[0].device)
        for li, k, v in zip(self.spec.attn_layers, self.k, self.v):
            layer = cache.layers[li]
            for src, dst in ((layer.keys, k), (layer.values, v)):
                seg = src[0, :, first_token:first_token + n * p, :]  # [H, nP, D]
                dst.index_copy_(0, idx, seg.transpose(0, 1).reshape(n, p, *dst.shape[2:]))

    def read_pages(self, pages: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per attention layer, (K, V) of pool pages `pages` as [1, H, n*P, D]."""
        idx = torch.tensor(pages, dtype=torch.long, device=self.k[0].device)
        out = []
        for k, v in zip(self.k, self.v):
            kv = []
            for t in (k, v):
                g = t.index_select(0, idx)  # [n, P, H, D]
                kv.append(g.reshape(-1, *t.shape[2:]).transpose(0, 1)[None].contiguous())
            out.append(tuple(kv))
        return out

    def write_states(self, cache, slot: int) -> None:
        """Copies every recurrent-state segment of `cache` into `slot`."""
        for seg, dst in zip(self.spec.states, self.states):
            layer = cache.layers[seg.layer]
            src = (layer.conv_states if seg.kind == "conv" else layer.recurrent_states)[seg.index]
            dst[slot].copy_(src[0])

    def read_states(self, slot: int) -> list[torch.Tensor]:
        """The segments of `slot`, each [1, *shape] (copies)."""
        return [t[slot][None].clone() for t in self.states]


class _Lru:
    """Keys (page hashes) -> ids of a fixed set; evicts least recent first."""

    def __init__(self, n: int):
        self.free = list(range(n - 1, -1, -1))
        self.table: collections.OrderedDict[bytes, int] = collections.OrderedDict()

    def get(self, key: bytes) -> int | None:
        return self.table.get(key)

    def touch(self, keys: Sequence[bytes]) -> None:
        # Deepest first, so that ancestors end up more recent and a prefix is
        # evicted from its end.
        for key in reversed(keys):
            if key in self.table:
                self.table.move_to_end(key)

    def alloc(self, n: int, protect=frozenset()) -> list[int]:
        """n free ids, evicting least recent keys not in `protect`."""
        while len(self.free) < n:
            victim = next((k for k in self.table if k not in protect), None)
            if victim is None:
                raise RuntimeError(f"pool exhausted: {n} needed, everything "
                                   f"else is in use by this request")
            self.free.append(self.table.pop(victim))
        return [self.free.pop() for _ in range(n)]

    def put(self, key: bytes, ident: int) -> None:
        old = self.table.pop(key, None)
        if old is not None and old != ident:
            self.free.append(old)
        self.table[key] = ident

    def clear(self) -> None:
        self.free.extend(self.table.values())
        self.table.clear()

    def __len__(self) -> int:
        return len(self.table)
