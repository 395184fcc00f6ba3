"""The daemon's device pools (kvtierd --device_pool_bytes): daemon-owned GPU
memory of snapshot slots that engines open over CUDA IPC, so a restarted
engine finds its hottest recurrent-state snapshots still in HBM.

    infos = ns.device_pools                  # [DevicePoolInfo], may be []
    pool = ns.open_device_pool(0)            # on its GPU (torch.cuda.set_device)
    res = ns.reserve(pages, 1, device_snapshots=1, device_pool=0)
    pool.save_snapshot(res.device_snapshot_rows[0], state)     # a CUDA tensor
    res.commit(hashes, snapshots=[(0, hashes[-1])],
               device_snapshots=[(0, hashes[-1])])
    with ns.lookup(hashes, device_pool=0) as lease:
        pool.restore_snapshot(lease, state)  # device-to-device, else host tier
    slots = pool.tensor()                    # torch view [rows, row_bytes]

The memory belongs to the daemon: when its session ends (it stopped or
restarted) every call answers UnavailableError and never touches the old
pointer; a tensor from tensor() or slot_tensor() then points at freed memory
and must not be used (check() first where that can happen).

Thread-safety: a DevicePool is thread-safe (the C handle is immutable and
CUDA calls are); closing is not synchronised with other threads' calls.
"""

from __future__ import annotations

import ctypes
import dataclasses
from ctypes import byref, c_void_p

from . import _lib
from ._handle import _Handle
from ._lease import Lease
from ._types import _stream_handle
from .errors import check


@dataclasses.dataclass(frozen=True)
class DevicePoolInfo:
    """One device pool as the daemon reported it (kvt_device_pool_info).
    withheld: the pool does not serve this namespace (kvtierd
    --device_pool_namespaces) and cannot be opened."""
    index: int
    device_ordinal: int
    pci_bus_id: str
    ipc_handle: bytes
    rows: int
    row_bytes: int
    row_stride: int
    withheld: bool


def _info(index: int, c: _lib.DevicePoolInfo) -> DevicePoolInfo:
    handle = ctypes.string_at(c.ipc_handle, c.ipc_handle_len) \
        if c.ipc_handle_len else b""
    return DevicePoolInfo(index, c.device_ordinal,
                          (c.pci_bus_id or b"").decode(), handle, c.rows,
                          c.row_bytes, c.row_stride, bool(c.withheld))


def device_pool_infos(ns) -> list[DevicePoolInfo]:
    """Namespace.device_pools: every pool the daemon reported."""
    lib = _lib.load()
    out = []
    for i in range(lib.kvt_num_device_pools(ns._need())):
        c = _lib.DevicePoolInfo()
        check(lib.kvt_device_pool(ns._ptr, i, byref(c)), "kvt_device_pool")
        out.append(_info(i, c))
    return out


class CudaMemory:
    """Device memory described by the CUDA array interface (version 2), for
    torch.as_tensor and other consumers (CuPy, Numba): `shape` elements of
    `typestr` ("|u1": bytes) at `address`, `strides` in bytes. Holds `owner`
    (the handle whose memory it is) alive as long as any tensor made from it.
    """

    def __init__(self, address: int, shape: tuple, strides: tuple | None,
                 typestr: str, owner):
        self.__cuda_array_interface__ = {
            "data": (int(address), False), "shape": tuple(shape),
            "strides": None if strides is None else tuple(strides),
            "typestr": typestr, "version": 2}
        self.owner = owner


def cuda_tensor(address: int, shape: tuple, strides: tuple | None = None,
                typestr: str = "|u1", owner=None):
    """A torch CUDA tensor over existing device memory at `address` (no copy;
    the device is the memory's). `owner` stays alive while the tensor does.
    """
    import torch
    return torch.as_tensor(CudaMemory(address, shape, strides, typestr, owner))


def _tensor_bytes(t, what: str) -> tuple[int, int]:
    """(address, bytes) of a contiguous CUDA tensor, or of an (address,
    bytes) pair."""
    if isinstance(t, tuple):
        address, nbytes = t
        return int(address), int(nbytes)
    if not getattr(t, "is_cuda", False):
        raise ValueError(f"{what}: must be a CUDA tensor or an (address, "
                         f"bytes) pair")
    if not t.is_contiguous():
        raise ValueError(f"{what}: must be contiguous")
    return t.data_ptr(), t.numel() * t.element_size()


class DevicePool(_Handle):
    """An opened device pool (kvt_device_pool_open); made by
    Namespace.open_device_pool on the current CUDA device, which must be the
    pool's GPU. Raises InvalidArgumentError naming index,
    PermissionDeniedError when withheld, FailedPreconditionError without a
    device or on another GPU, UnavailableError once the exporting session
    ended."""

    def __init__(self, ns, index: int):
        self._ns = ns  # the namespace outlives the handle
        out = c_void_p()
        check(_lib.load().kvt_device_pool_open(ns._need(), index, byref(out)),
              "kvt_device_pool_open")
        self._ptr = out
        c = _lib.DevicePoolInfo()
        check(_lib.load().kvt_device_pool_describe(out, byref(c)),
              "kvt_device_pool_describe")
        self.info = _info(index, c)

    def check(self) -> None:
        """Returns while the exporting daemon session is open; raises
        UnavailableError after."""
        check(_lib.load().kvt_device_pool_check(self._need()),
              "kvt_device_pool_check")

    def slot(self, row: int) -> int:
        """Device address of slot `row` (InvalidArgumentError naming row,
        UnavailableError as check())."""
        out = c_void_p()
        check(_lib.load().kvt_device_pool_slot(self._need(), row, byref(out)),
              "kvt_device_pool_slot")
        return int(out.value or 0)

    def tensor(self):
        """The whole pool as a torch.uint8 CUDA tensor [rows, row_bytes] (row
        stride row_stride) over the daemon's memory: writes go to the slots.
        Valid while this handle is open and check() passes."""
        i = self.info
        return cuda_tensor(self.slot(0), (i.rows, i.row_bytes),
                           (i.row_stride, 1), owner=self)

    def slot_tensor(self, row: int, nbytes: int | None = None):
        """Slot `row`'s first nbytes (default row_bytes) as a torch.uint8
        CUDA tensor over the daemon's memory."""
        nbytes = self.info.row_bytes if nbytes is None else nbytes
        if not 0 <= nbytes <= self.info.row_bytes:
            raise ValueError(f"nbytes: {nbytes} is not in [0, "
                             f"{self.info.row_bytes}]")
        return cuda_tensor(self.slot(row), (nbytes,), owner=self)

    def _stream(self, stream) -> c_void_p:
        if stream is None:
            import torch
            stream = torch.cuda.current_stream()
        return c_void_p(_stream_handle(stream))

    def save_snapshot(self, row: int, src, stream=None) -> None:
        """Queues a copy of `src` (a contiguous CUDA tensor, or an (address,
        bytes) pair; at most row_bytes) into slot `row` on `stream` (None: the
        current torch stream)."""
        address, nbytes = _tensor_bytes(src, "src")
        check(_lib.load().kvt_device_pool_save(self._need(), row,
                                               c_void_p(address), nbytes,
                                               self._stream(stream)),
              "kvt_device_pool_save")

    def restore_snapshot(self, lease: Lease, dst, stream=None) -> None:
        """Queues the restore of the lease's snapshot into `dst` (a contiguous
        CUDA tensor or an (address, bytes) pair): from this pool's slot when
        lease.has_device_snapshot, else from the host snapshot bank.
        FailedPreconditionError when the lease holds no snapshot."""
        address, nbytes = _tensor_bytes(dst, "dst")
        check(_lib.load().kvt_device_pool_restore(self._need(), lease._need(),
                                                  c_void_p(address), nbytes,
                                                  self._stream(stream)),
              "kvt_device_pool_restore")

    def close(self) -> None:
        """cudaIpcCloseMemHandle. REQUIRES: no queued copy or live tensor
        uses the pool's memory."""
        if self._ptr is None:
            return
        _lib.load().kvt_device_pool_close(self._take())
