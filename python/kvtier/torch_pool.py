"""Describes a paged KV pool made of torch tensors to libkvtier.

An engine's pool is a set of tensors whose dimension 0 is the page id:
per-layer K and V tensors [num_pages, page_size, kv_heads, head_dim] (vLLM's
and SGLang's paged layout), a flat [num_pages, bytes] uint8 tensor, MLA's one
latent tensor per layer, side tensors such as fp8 scales — any tensor whose
page p, tensor[p], is contiguous. Snapshot segments (recurrent states of
hybrid models) are tensors whose dimension 0 is the snapshot slot.

TorchPool turns those tensors into the namespace layout (bank row sizes,
dtypes, snapshot row size) and the kvt_pool descriptor (data_ptr, strides),
and keeps the tensors alive as long as a Transfer made from it exists. Row
format: a row of bank B holds tensor[p]'s bytes for each of B's tensors, in
the order given (client/pool.h).

CUDA tensors get the CUDA backend (copies on the caller's stream); CPU
tensors get the reference backend (host memcpy, for tests and host-only
engines).

Thread-safety: a TorchPool is immutable after construction. The engine must
not free or reallocate the tensors while transfers are queued.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .client import BankLayout, Layout, PoolDescriptor, PoolTensorSpec


def tensor_spec(t, what: str = "tensor") -> PoolTensorSpec:
    """The pool description of `t` (dimension 0 = page or slot).

    Raises ValueError naming `what` when t has no dimensions or a page
    (t[0]) is not contiguous.
    """
    if t.dim() < 1 or t.shape[0] < 1:
        raise ValueError(f"{what}: needs a page dimension 0 of size >= 1, "
                         f"got shape {tuple(t.shape)}")
    if not t[0].is_contiguous():
        raise ValueError(f"{what}: each page {what}[p] must be contiguous "
                         f"(shape {tuple(t.shape)}, strides {t.stride()})")
    es = t.element_size()
    return PoolTensorSpec(base=t.data_ptr(), page_stride=t.stride(0) * es,
                          bytes_per_page=t[0].numel() * es)


def kv_pool_tensors(kv_caches) -> list:
    """Flattens an engine's per-layer KV caches into pool tensors, K then V
    per layer. Each item of `kv_caches` is a (K, V) pair, a tensor
    [2, num_pages, ...] (split into K and V), or a single tensor
    [num_pages, ...] (MLA latent, or a flat layout)."""
    out = []
    for i, item in enumerate(kv_caches):
        if isinstance(item, (tuple, list)):
            out.extend(item)
        elif item.dim() >= 2 and item.shape[0] == 2:
            out.extend(item.unbind(0))
        else:
            out.append(item)
    return out


def _dtype_name(t) -> str:
    return str(t.dtype).replace("torch.", "")


class TorchPool:
    """A paged pool of torch tensors, described for libkvtier.

    Args:
      banks: the page banks in namespace order, name -> tensors (dimension 0
        the page), or a plain sequence of tensors for one bank named "kv".
      snapshot: snapshot segments (dimension 0 the slot), e.g. each linear
        attention layer's conv and recurrent state.
    Raises:
      ValueError naming the tensor when tensors disagree on the page count
      (or slot count), live on different devices, or a page is not contiguous.
    """

    def __init__(self, banks: Mapping[str, Sequence] | Sequence,
                 snapshot: Sequence = ()):
        if not isinstance(banks, Mapping):
            banks = {"kv": list(banks)}
        if not banks:
            raise ValueError("banks: at least one page bank is needed")
        self.banks = {name: list(ts) for name, ts in banks.items()}
        self.snapshot = list(snapshot)
        devices = set()
        self.num_pages = None
        self._specs = []
        for name, ts in self.banks.items():
            if not ts:
                raise ValueError(f"banks[{name!r}]: lists no tensors")
            specs = []
            for i, t in enumerate(ts):
                what = f"banks[{name!r}][{i}]"
                if self.num_pages is None:
                    self.num_pages = t.shape[0]
                elif t.shape[0] != self.num_pages:
                    raise ValueError(f"{what}: {t.shape[0]} pages, the pool has "
                                     f"{self.num_pages}")
                devices.add(t.device)
                specs.append(tensor_spec(t, what))
            self._specs.append((name, tuple(specs)))
        self.num_snapshot_slots = self.snapshot[0].shape[0] if self.snapshot else 0
        snap_specs = []
        for i, t in enumerate(self.snapshot):
            what = f"snapshot[{i}]"
            if t.shape[0] != self.num_snapshot_slots:
                raise ValueError(f"{what}: {t.shape[0]} slots, snapshot[0] has "
                                 f"{self.num_snapshot_slots}")
            devices.add(t.device)
            snap_specs.append(tensor_spec(t, what))
        self._snapshot_specs = tuple(snap_specs)
        if len(devices) != 1:
            raise ValueError(f"tensors: all must be on one device, got "
                             f"{sorted(str(d) for d in devices)}")
        self.device = devices.pop()
        if self.device.type not in ("cuda", "cpu"):
            raise ValueError(f"tensors: device {self.device} is neither CUDA nor CPU")

    @property
    def backend(self) -> str:
        return "cuda" if self.device.type == "cuda" else "reference"

    def row_bytes(self, bank: str) -> int:
        """Bytes of one row of `bank`: the sum of its tensors' page sizes."""
        for name, specs in self._specs:
            if name == bank:
                return sum(s.bytes_per_page for s in specs)
        raise KeyError(bank)

    @property
    def snapshot_row_bytes(self) -> int:
        return sum(s.bytes_per_page for s in self._snapshot_specs)

    def layout(self, *, tokens_per_page: int | None = None,
               num_layers: int | None = None, model: str = "",
               tp_size: int = 1, replicated: bool = False,
               hash_kind: str = "sha256") -> Layout:
        """The namespace layout of this pool.

        tokens_per_page defaults to dimension 1 of the "kv" bank's (or the
        first bank's) first tensor when it is 4-D [pages, page_size, heads,
        dim]; num_layers defaults to half the tensors of that bank (K and V
        per layer). Raises ValueError when a default cannot be derived.
        """
        name, tensors = ("kv", self.banks["kv"]) if "kv" in self.banks else \
            next(iter(self.banks.items()))
        if tokens_per_page is None:
            if tensors[0].dim() != 4:
                raise ValueError(f"tokens_per_page: banks[{name!r}][0] is not "
                                 f"[pages, page_size, heads, dim]; pass it")
            tokens_per_page = int(tensors[0].shape[1])
        if num_layers is None:
            if len(tensors) % 2:
                raise ValueError(f"num_layers: banks[{name!r}] has an odd number "
                                 f"of tensors ({len(tensors)}); pass it")
            num_layers = len(tensors) // 2
        page_banks = []
        for bank, ts in self.banks.items():
            dtypes = sorted({_dtype_name(t) for t in ts})
            page_banks.append(BankLayout(bank, self.row_bytes(bank), ",".join(dtypes)))
        return Layout(tokens_per_page=tokens_per_page, num_layers=num_layers,
                      page_banks=tuple(page_banks),
                      snapshot_row_bytes=self.snapshot_row_bytes, model=model,
                      tp_size=tp_size, replicated=replicated, hash_kind=hash_kind)

    def descriptor(self) -> PoolDescriptor:
        """The kvt_pool descriptor (addresses of the tensors as they are now)."""
        return PoolDescriptor(
            num_pages=self.num_pages, banks=tuple(self._specs),
            snapshot=self._snapshot_specs,
            num_snapshot_slots=self.num_snapshot_slots,
            device=(self.device.index or 0) if self.device.type == "cuda" else 0,
            backend=self.backend,
            keepalive=tuple(t for ts in self.banks.values() for t in ts) +
            tuple(self.snapshot))
