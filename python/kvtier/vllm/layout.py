"""What a vLLM engine's KV cache looks like to kvtier, without vLLM.

vLLM (>= 0.32) allocates one int8 backing buffer and places every layer's
pages in it (KVCacheTensor: layer l's page of block b starts at
offset + l * layer_stride + b * block_stride). kvtier stores a *block* as one
row: the bytes of block b in every distinct block-strided region of that
buffer, region by region. With a block-first layout a block is one
contiguous run (one copy per page); with a layer-first layout it is one run
per layer. Hybrid models overlay their groups on the same regions (a block id
belongs to one group at a time), so an attention block and a Mamba block
have the same size: the attention group's blocks go to the page bank, the
Mamba group's block at a page boundary (the recurrent state after that
page) to the snapshot bank.

CacheDescription is the plain-data digest of vLLM's KVCacheConfig that both
halves of the connector derive the namespace layout from; the worker half
(worker.py) also maps it onto the buffer. NamespaceIdentity is what must
match for two engines to share rows.

Thread-safety: everything here is immutable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from ..client import BankLayout, Layout


@dataclasses.dataclass(frozen=True)
class Placement:
    """One vLLM KVCacheTensor: where a set of same-shaped layers lives."""
    layers: tuple[str, ...]
    layer_stride: int
    block_stride: int
    page_bytes: int  # one layer's page (the largest, where groups overlay)
    offset: int = 0


@dataclasses.dataclass(frozen=True)
class Group:
    """One KV cache group: "attention" (full attention pages), "mamba"
    (recurrent state per block), or "other" (not supported)."""
    kind: str
    block_size: int
    layers: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Region:
    """Block b of this region is [offset + b * stride, + nbytes) in the
    backing buffer."""
    offset: int
    stride: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class CacheDescription:
    num_blocks: int
    placements: tuple[Placement, ...]
    groups: tuple[Group, ...]
    hash_block_size: int
    dtype: str  # the KV cache's dtype, e.g. "bfloat16", "fp8_e4m3"

    def __post_init__(self):
        attention = self.attention_groups
        if len(attention) != 1:
            raise ValueError(
                f"kvtier needs exactly one full-attention KV cache group, the "
                f"model has {len(attention)} (groups: "
                f"{', '.join(g.kind for g in self.groups)})")
        other = [g for g in self.groups if g.kind not in ("attention", "mamba")]
        if other:
            raise ValueError("kvtier supports full attention and Mamba groups; "
                             "this model also has a group kvtier cannot store "
                             "(sliding window, cross attention, ...)")
        if len(self.mamba_groups) > 1:
            raise ValueError(
                f"kvtier stores one recurrent-state block per page boundary; "
                f"this model has {len(self.mamba_groups)} Mamba groups "
                f"(supported: 0 or 1)")
        bs = self.block_size
        if any(g.block_size != bs for g in self.groups):
            raise ValueError("KV cache groups with different block sizes are "
                             "not supported")
        if bs % self.hash_block_size:
            raise ValueError(f"block size {bs} is not a multiple of the hash "
                             f"block size {self.hash_block_size}")

    @property
    def attention_groups(self) -> list[int]:
        return [i for i, g in enumerate(self.groups) if g.kind == "attention"]

    @property
    def mamba_groups(self) -> list[int]:
        return [i for i, g in enumerate(self.groups) if g.kind == "mamba"]

    @property
    def attention_group(self) -> int:
        return self.attention_groups[0]

    @property
    def mamba_group(self) -> int | None:
        m = self.mamba_groups
        return m[0] if m else None

    @property
    def hybrid(self) -> bool:
        return self.mamba_group is not None

    @property
    def block_size(self) -> int:
        return self.groups[self.attention_group].block_size

    @property
    def hashes_per_block(self) -> int:
        return self.block_size // self.hash_block_size

    def regions(self) -> list[Region]:
        """The distinct block-strided regions of the buffer, in buffer order:
        each layer's page, pages that coincide (groups overlaid) counted
        once, pages that are adjacent in every block (a block-first layout)
        merged into one run. Raises ValueError when two pages overlap
        without coinciding."""
        pages: dict[tuple[int, int], int] = {}
        for p in self.placements:
            for l in range(len(p.layers)):
                key = (p.offset + l * p.layer_stride, p.block_stride)
                pages[key] = max(pages.get(key, 0), p.page_bytes)
        regions: list[Region] = []
        for (offset, stride), nbytes in sorted(pages.items()):
            last = regions[-1] if regions else None
            if last and last.stride == stride and offset < last.offset + last.nbytes:
                raise ValueError(f"KV cache pages at buffer offsets {last.offset} "
                                 f"and {offset} overlap without coinciding")
            if last and last.stride == stride and offset == last.offset + last.nbytes:
                regions[-1] = Region(last.offset, stride, last.nbytes + nbytes)
            else:
                regions.append(Region(offset, stride, nbytes))
        return regions

    @property
    def row_bytes(self) -> int:
        """Bytes of one block: the page bank's row (and the snapshot row)."""
        return sum(r.nbytes for r in self.regions())

    @property
    def num_layers(self) -> int:
        return len(self.groups[self.attention_group].layers)


@dataclasses.dataclass(frozen=True)
class NamespaceIdentity:
    """Everything that must be equal for two engines to share KV: the model
    (path or name, revision, a digest of its config), dtypes, block size, TP.
    The hash chain (vLLM's block hashes) separates prompts, cache salts,
    LoRAs and multimodal inputs; this separates what the hashes do not."""
    model: str
    revision: str
    config_digest: str
    dtype: str
    kv_cache_dtype: str
    block_size: int
    tp_size: int
    tp_rank: int
    hash_algo: str
    cache_digest: str = ""  # the physical layout and row structure

    def digest(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def default_name(self) -> str:
        """The namespace name when the configuration names none (the TP
        rank is inside the digest: each rank has its own namespace)."""
        return f"vllm-{self.digest()[:24]}"


def namespace_layout(cache: CacheDescription, identity: NamespaceIdentity,
                     hash_bytes: int) -> Layout:
    """The kvtier layout of an engine's namespace. `hash_bytes` is the
    length of vLLM's block hashes (32 for sha256, 16 for xxhash)."""
    kinds = {32: "sha256", 16: "xxh3_128"}
    if hash_bytes not in kinds:
        raise ValueError(f"vLLM block hashes of {hash_bytes} bytes: kvtier "
                         f"takes 32 (sha256) or 16 (xxhash)")
    model = f"{identity.model}@{identity.config_digest[:12]}"
    if len(model) > 256:
        model = model[-256:]
    row = cache.row_bytes
    return Layout(tokens_per_page=cache.block_size, num_layers=cache.num_layers,
                  page_banks=(BankLayout("kv", row, cache.dtype[:32]),),
                  snapshot_row_bytes=row if cache.hybrid else 0, model=model,
                  tp_size=1, hash_kind=kinds[hash_bytes])
