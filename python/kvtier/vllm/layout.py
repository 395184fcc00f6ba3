"""What a vLLM engine's KV cache looks like to kvtier, without vLLM.

vLLM (>= 0.32) allocates one int8 backing buffer and places every layer's
pages in it (KVCacheTensor: layer l's page of block b starts at
offset + l * layer_stride + b * block_stride). kvtier stores a *block* as one
row: the bytes of block b in every distinct block-strided region of that
buffer, region by region. With a block-first layout a block is one
contiguous run (one copy per page); with a layer-first layout it is one run
per layer. Sliding-window models (Gemma 3, gpt-oss) overlay a group of
sliding-window layers on the same regions as the full-attention group: a
page row then holds the full-attention block and each sliding-window
group's block of that page (libkvtier's page groups), stored only while
vLLM still holds them (a page is never stored without them), loaded only
for the pages the window needs. Hybrid models overlay their groups on the same regions (a block id
belongs to one group at a time), so an attention block and a Mamba block
have the same size: the attention group's blocks go to the page bank, and
at a page boundary each Mamba group's block (the recurrent state of that
group's layers after that page) goes to the snapshot bank, whose row holds
one block per Mamba group, in group order (full-size Qwen3-Next / Qwen3.5:
three groups of linear-attention layers beside one of full attention).

CacheDescription is the plain-data digest of vLLM's KVCacheConfig that both
halves of the connector derive the namespace layout from; the worker half
(worker.py) also maps it onto the buffer. NamespaceIdentity is what must
match for two engines to share rows. Ranks is an engine's parallel shape:
its TP x PP workers are the ranks of one namespace (worker w of PP stage p
is rank p * tp_size + w), each storing and loading its own shard; a page is
a hit only where every rank committed it (the daemon's rule).

Thread-safety: everything here is immutable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from ..client import BankLayout, Layout


# The most Mamba groups a snapshot row holds (libkvtier's snapshot groups),
# and the most blocks a page row holds (its page groups).
MAX_MAMBA_GROUPS = 64
MAX_PAGE_GROUPS = 64


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
    """One KV cache group: "attention" (full attention pages), "sliding"
    (sliding-window attention over the last `window` tokens), "mamba"
    (recurrent state per block), or "other" (not supported)."""
    kind: str
    block_size: int
    layers: tuple[str, ...]
    window: int = 0  # "sliding": the window in tokens


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
        other = [g for g in self.groups
                 if g.kind not in ("attention", "sliding", "mamba")]
        if other:
            raise ValueError("kvtier supports full-attention, sliding-window and "
                             "Mamba groups; this model also has a group kvtier "
                             "cannot store (cross attention, chunked local "
                             "attention, ...): serve it without the kvtier "
                             "connector (docs/vllm.md, \"KV cache groups\")")
        if self.page_groups > MAX_PAGE_GROUPS:
            raise ValueError(
                f"kvtier stores at most {MAX_PAGE_GROUPS - 1} sliding-window "
                f"groups' blocks per page; this model has "
                f"{len(self.sliding_groups)}")
        if any(self.groups[g].window < 1 for g in self.sliding_groups):
            raise ValueError("a sliding-window group without a window")
        if len(self.mamba_groups) > MAX_MAMBA_GROUPS:
            raise ValueError(
                f"kvtier stores at most {MAX_MAMBA_GROUPS} Mamba groups' state "
                f"blocks per page boundary; this model has "
                f"{len(self.mamba_groups)}")
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
    def sliding_groups(self) -> list[int]:
        return [i for i, g in enumerate(self.groups) if g.kind == "sliding"]

    @property
    def page_groups(self) -> int:
        """Blocks a page row holds: the full-attention group's, then each
        sliding-window group's, in group order."""
        return 1 + len(self.sliding_groups)

    def window_pages(self, group: int) -> int:
        """Pages before a resume point whose blocks sliding-window group
        `group` needs (vLLM's own rule: its last window - 1 tokens)."""
        g = self.groups[group]
        return -(-(g.window - 1) // g.block_size)

    @property
    def hybrid(self) -> bool:
        return bool(self.mamba_groups)

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
        """Bytes of one block (a page row holds page_groups of them, a
        snapshot row one per Mamba group)."""
        return sum(r.nbytes for r in self.regions())

    @property
    def num_layers(self) -> int:
        return len(self.groups[self.attention_group].layers)


# The daemon's Layout.tp_size is at most this: TP x PP of one engine.
MAX_RANKS = 64


@dataclasses.dataclass(frozen=True)
class Ranks:
    """An engine's workers as a namespace's ranks.

    tp_size, pp_size: vLLM's tensor and pipeline parallel sizes.
    replicated: every TP rank of a stage holds the same KV (MLA latents):
      one copy serves them all, stored by TP rank 0 (kvtier's
      Layout.replicated; PP stages would each need their own copy, which
      the daemon's replicated layout cannot express, so replicated KV
      requires pp_size 1).
    """
    tp_size: int = 1
    pp_size: int = 1
    replicated: bool = False

    def __post_init__(self):
        if self.tp_size < 1 or self.pp_size < 1:
            raise ValueError(f"tensor_parallel_size={self.tp_size}, "
                             f"pipeline_parallel_size={self.pp_size}: must be >= 1")
        if self.world > MAX_RANKS:
            raise ValueError(
                f"kvtier: tensor_parallel_size x pipeline_parallel_size = "
                f"{self.tp_size} x {self.pp_size} = {self.world}: a namespace "
                f"has at most {MAX_RANKS} ranks (docs/vllm.md, \"Parallel "
                f"engines\")")
        if self.replicated and self.pp_size > 1:
            raise ValueError(
                f"kvtier: pipeline_parallel_size={self.pp_size} with KV that "
                f"every TP rank holds alike (MLA): kvtier stores such KV once "
                f"for all ranks, which cannot hold one copy per pipeline "
                f"stage; run MLA models with pipeline_parallel_size=1 "
                f"(docs/vllm.md, \"Parallel engines\")")

    @property
    def world(self) -> int:
        return self.tp_size * self.pp_size

    def rank(self, tp_rank: int, pp_rank: int) -> int:
        """The namespace rank of TP rank `tp_rank` of PP stage `pp_rank`."""
        if not (0 <= tp_rank < self.tp_size and 0 <= pp_rank < self.pp_size):
            raise ValueError(f"worker (tp {tp_rank}, pp {pp_rank}) is outside "
                             f"TP {self.tp_size} x PP {self.pp_size}")
        return pp_rank * self.tp_size + tp_rank

    def stores(self, rank: int) -> bool:
        """Whether rank `rank` writes its KV to the tier (replicated KV:
        TP rank 0 only; the others' bytes are the same)."""
        return not self.replicated or rank % self.tp_size == 0

    @property
    def storing(self) -> frozenset[int]:
        """The ranks whose stores must all succeed for a page to count."""
        return frozenset(r for r in range(self.world) if self.stores(r))

    def own_rows(self, rank: int) -> bool:
        """Whether rank `rank` reads the very rows of rank 0 (the
        scheduler's lease): rank 0 itself, or every rank of replicated KV."""
        return rank == 0 or self.replicated


@dataclasses.dataclass(frozen=True)
class NamespaceIdentity:
    """Everything that must be equal for two engines to share KV: the model
    (path or name, revision, a digest of its config), dtypes, block size,
    TP and PP sizes (each rank's shard depends on both). The hash chain
    (vLLM's block hashes) separates prompts, cache salts, LoRAs and
    multimodal inputs; this separates what the hashes do not. Every rank of
    an engine has the same identity: its workers are one namespace's ranks."""
    model: str
    revision: str
    config_digest: str
    dtype: str
    kv_cache_dtype: str
    block_size: int
    tp_size: int
    pp_size: int
    hash_algo: str
    cache_digest: str = ""  # the physical layout and row structure

    def digest(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def default_name(self) -> str:
        """The namespace name when the configuration names none (one for
        every rank of the engine; TP and PP sizes are in the digest)."""
        return f"vllm-{self.digest()[:24]}"


def namespace_layout(cache: CacheDescription, identity: NamespaceIdentity,
                     hash_bytes: int, ranks: Ranks = Ranks()) -> Layout:
    """The kvtier layout of an engine's namespace (`ranks`: its workers,
    the namespace's ranks). `hash_bytes` is the length of vLLM's block
    hashes (32 for sha256, 16 for xxhash)."""
    kinds = {32: "sha256", 16: "xxh3_128"}
    if hash_bytes not in kinds:
        raise ValueError(f"vLLM block hashes of {hash_bytes} bytes: kvtier "
                         f"takes 32 (sha256) or 16 (xxhash)")
    model = f"{identity.model}@{identity.config_digest[:12]}"
    if len(model) > 256:
        model = model[-256:]
    row = cache.row_bytes
    return Layout(tokens_per_page=cache.block_size, num_layers=cache.num_layers,
                  page_banks=(BankLayout("kv", row * cache.page_groups,
                                         cache.dtype[:32]),),
                  snapshot_row_bytes=row * len(cache.mamba_groups), model=model,
                  tp_size=ranks.world, replicated=ranks.replicated,
                  hash_kind=kinds[hash_bytes])
