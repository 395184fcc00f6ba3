"""ctypes declarations of libkvtier's C ABI (client/include/kvtier/kvtier.h).

This module finds and loads libkvtier.so once per process and declares the
argument and result types of every function of the header. It mirrors the
header by hand: the structs below must match kvtier.h field for field, and
python/tests/test_abi_layout.py checks that they do (sizes, alignments and
offsets against the C compiler's, through kvtier_abi_layout) and that every
function of the header is declared here with its argument count. The ABI is
versioned by KVT_API_VERSION; additions keep the version.

Where the library comes from, first match wins:
  1. $KVTIER_LIB (a path to libkvtier.so);
  2. libkvtier.so bundled inside the package (a pip install from the build);
  3. $KVT_BIN/client/libkvtier.so or $KVT_BIN/libkvtier.so (the GPU machine's
     bundle, see .device/env.sh);
  4. the build tree of a source checkout: <repo>/build*/client/libkvtier.so,
     newest first.

Thread-safety: loading is guarded by a lock; the loaded CDLL is immutable and
its functions may be called from any thread (kvt_last_error is per thread, so
read it on the thread whose call failed, as errors.check does).
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from ctypes import (POINTER, Structure, c_char_p, c_int32, c_size_t, c_uint8,
                    c_uint32, c_uint64, c_void_p)

API_VERSION = 1

# kvt_hash_kind
HASH_SHA256 = 1
HASH_XXH3_128 = 2
# kvt_backend
BACKEND_CUDA = 0
BACKEND_REFERENCE = 1


class BankLayout(Structure):
    _fields_ = [("name", c_char_p), ("row_bytes", c_uint64), ("dtype", c_char_p)]


class Layout(Structure):
    _fields_ = [
        ("model", c_char_p),
        ("tokens_per_page", c_uint32),
        ("num_layers", c_uint32),
        ("page_banks", POINTER(BankLayout)),
        ("num_page_banks", c_uint32),
        ("snapshot_row_bytes", c_uint64),
        ("tp_size", c_uint32),
        ("replicated", c_int32),
        ("hash_kind", c_int32),
    ]


class AttachOptions(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("layout", POINTER(Layout)),
        ("tp_rank", c_uint32),
        ("page_rows", c_uint64),
        ("snapshot_rows", c_uint64),
        ("max_replay_tokens", c_uint32),
        ("tenant_salt", c_void_p),
        ("tenant_salt_len", c_size_t),
        ("register_with_cuda", c_int32),
    ]


class BankInfo(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("base", c_void_p),
        ("rows", c_uint64),
        ("row_bytes", c_uint64),
        ("row_stride", c_uint64),
        ("cuda_registered", c_int32),
        ("huge_pages", c_int32),
    ]


class SnapshotPlacement(Structure):
    _fields_ = [("index", c_uint32), ("hash", POINTER(c_uint8))]


class CommitResult(Structure):
    _fields_ = [
        ("committed_pages", c_uint32),
        ("deduplicated_pages", c_uint32),
        ("committed_snapshots", c_uint32),
        ("deduplicated_snapshots", c_uint32),
    ]


class PoolTensor(Structure):
    _fields_ = [("base", c_uint64), ("page_stride", c_uint64),
                ("bytes_per_page", c_uint64)]


class BankPool(Structure):
    _fields_ = [("bank", c_char_p), ("tensors", POINTER(PoolTensor)),
                ("num_tensors", c_uint32)]


class Pool(Structure):
    _fields_ = [
        ("device", c_int32),
        ("num_pages", c_uint64),
        ("banks", POINTER(BankPool)),
        ("num_banks", c_uint32),
        ("snapshot", POINTER(PoolTensor)),
        ("num_snapshot_tensors", c_uint32),
        ("num_snapshot_slots", c_uint64),
    ]


class DevicePoolInfo(Structure):
    _fields_ = [
        ("device_ordinal", c_int32),
        ("pci_bus_id", c_char_p),
        ("ipc_handle", POINTER(c_uint8)),
        ("ipc_handle_len", c_size_t),
        ("rows", c_uint64),
        ("row_bytes", c_uint64),
        ("row_stride", c_uint64),
        ("withheld", c_int32),
    ]


class MirrorEntry(Structure):
    _fields_ = [("logical", c_int32), ("slot", c_int32), ("token", c_int32)]


class MirrorOptions(Structure):
    _fields_ = [
        ("logical_pages", c_uint32),
        ("gpu_slots", c_uint32),
        ("max_batch", c_uint32),
        ("max_selected", c_uint32),
        ("max_store_entries", c_uint32),
        ("copy_ctas", c_uint32),
        ("store_ctas", c_uint32),
        ("backend", c_int32),
    ]


class PrefetchResult(Structure):
    _fields_ = [
        ("local_pages", c_uint32),
        ("remote_pages", c_uint32),
        ("prefetching_pages", c_uint32),
    ]


# Every struct of kvtier.h by its C name (tests/test_abi_layout.py compares
# them with the header as the C compiler lays it out).
STRUCTS = {
    "kvt_bank_layout": BankLayout, "kvt_layout": Layout,
    "kvt_attach_options": AttachOptions, "kvt_bank_info": BankInfo,
    "kvt_snapshot_placement": SnapshotPlacement,
    "kvt_commit_result": CommitResult, "kvt_pool_tensor": PoolTensor,
    "kvt_bank_pool": BankPool, "kvt_pool": Pool,
    "kvt_device_pool_info": DevicePoolInfo, "kvt_mirror_entry": MirrorEntry,
    "kvt_mirror_options": MirrorOptions, "kvt_prefetch_result": PrefetchResult,
}

_u8p = POINTER(c_uint8)
_u32p = POINTER(c_uint32)
_status = c_int32

# name: (restype, argtypes). Opaque handles are c_void_p.
_SIGNATURES = {
    "kvt_last_error": (c_char_p, []),
    "kvt_version": (c_char_p, []),
    "kvt_connect": (_status, [c_char_p, c_char_p, c_uint32, POINTER(c_void_p)]),
    "kvt_connect_instance": (_status, [c_char_p, c_char_p, c_uint32, _u8p, c_size_t,
                                       POINTER(c_void_p)]),
    "kvt_client_close": (None, [c_void_p]),
    "kvt_session_id": (c_uint64, [c_void_p]),
    "kvt_session_alive": (c_int32, [c_void_p]),
    "kvt_drop": (_status, [c_void_p, c_char_p, _u8p, c_size_t, c_int32]),
    "kvt_attach": (_status, [c_void_p, POINTER(AttachOptions), POINTER(c_void_p)]),
    "kvt_namespace_close": (None, [c_void_p]),
    "kvt_namespace_id": (c_uint64, [c_void_p]),
    "kvt_hash_bytes": (c_uint32, [c_void_p]),
    "kvt_namespace_acl": (c_char_p, [c_void_p]),
    "kvt_num_page_banks": (c_uint32, [c_void_p]),
    "kvt_page_bank": (_status, [c_void_p, c_uint32, POINTER(BankInfo)]),
    "kvt_snapshot_bank": (_status, [c_void_p, POINTER(BankInfo)]),
    "kvt_hash_tokens": (_status, [c_void_p, POINTER(c_int32), c_size_t, _u8p,
                                  c_size_t, _u8p, c_size_t, _u8p, c_size_t,
                                  POINTER(c_size_t)]),
    "kvt_lookup": (_status, [c_void_p, _u8p, c_size_t, c_int32, POINTER(c_void_p)]),
    "kvt_lease_matched_pages": (c_uint32, [c_void_p]),
    "kvt_lease_usable_pages": (c_uint32, [c_void_p]),
    "kvt_lease_rows": (_u32p, [c_void_p]),
    "kvt_lease_has_snapshot": (c_int32, [c_void_p]),
    "kvt_lease_snapshot_row": (c_uint32, [c_void_p]),
    "kvt_lease_release": (_status, [c_void_p, c_void_p]),
    "kvt_reserve": (_status, [c_void_p, c_uint32, c_uint32, POINTER(c_void_p)]),
    "kvt_reservation_id": (c_uint64, [c_void_p]),
    "kvt_reservation_num_page_rows": (c_uint32, [c_void_p]),
    "kvt_reservation_page_rows": (_u32p, [c_void_p]),
    "kvt_reservation_num_snapshot_rows": (c_uint32, [c_void_p]),
    "kvt_reservation_snapshot_rows": (_u32p, [c_void_p]),
    "kvt_reservation_set_token_ids": (_status, [c_void_p, _u32p, c_size_t]),
    "kvt_commit": (_status, [c_void_p, _u8p, c_size_t, _u8p, c_size_t,
                             POINTER(SnapshotPlacement), c_size_t,
                             POINTER(CommitResult)]),
    "kvt_commit_after": (_status, [c_void_p, c_void_p, _u8p, c_size_t, _u8p,
                                   c_size_t, POINTER(SnapshotPlacement),
                                   c_size_t, POINTER(c_void_p)]),
    "kvt_pending_wait": (_status, [c_void_p, c_uint32, POINTER(CommitResult)]),
    "kvt_abort": (_status, [c_void_p]),
    "kvt_reservation_free": (None, [c_void_p]),
    "kvt_pending_free": (None, [c_void_p]),
    "kvt_abort_after": (_status, [c_void_p, c_void_p]),
    "kvt_transfer_create": (_status, [c_void_p, c_int32, POINTER(Pool),
                                      c_uint32, POINTER(c_void_p)]),
    "kvt_transfer_free": (None, [c_void_p]),
    "kvt_evict": (_status, [c_void_p, _u32p, _u32p, c_size_t, c_void_p]),
    "kvt_rehydrate": (_status, [c_void_p, _u32p, _u32p, c_size_t, c_void_p]),
    "kvt_snapshot_save": (_status, [c_void_p, c_uint32, c_uint32, c_void_p]),
    "kvt_snapshot_restore": (_status, [c_void_p, c_uint32, c_uint32, c_void_p]),
    "kvt_snapshot_save_groups": (_status, [c_void_p, _u32p, c_uint32, c_uint32,
                                           c_void_p]),
    "kvt_snapshot_restore_groups": (_status, [c_void_p, _u32p, c_uint32, c_uint32,
                                              c_void_p]),
    # Device pools and device snapshots (c_api_device_pool.cc).
    "kvt_num_device_pools": (c_uint32, [c_void_p]),
    "kvt_device_pools_valid": (c_int32, [c_void_p]),
    "kvt_device_pool": (_status, [c_void_p, c_uint32, POINTER(DevicePoolInfo)]),
    "kvt_device_pool_open": (_status, [c_void_p, c_uint32, POINTER(c_void_p)]),
    "kvt_device_pool_close": (None, [c_void_p]),
    "kvt_device_pool_describe": (_status, [c_void_p, POINTER(DevicePoolInfo)]),
    "kvt_device_pool_check": (_status, [c_void_p]),
    "kvt_device_pool_slot": (_status, [c_void_p, c_uint32, POINTER(c_void_p)]),
    "kvt_device_pool_save": (_status, [c_void_p, c_uint32, c_void_p, c_size_t,
                                       c_void_p]),
    "kvt_device_pool_restore": (_status, [c_void_p, c_void_p, c_void_p, c_size_t,
                                          c_void_p]),
    "kvt_lookup_with_device": (_status, [c_void_p, _u8p, c_size_t, c_uint32,
                                         c_int32, POINTER(c_void_p)]),
    "kvt_lease_has_device_snapshot": (c_int32, [c_void_p]),
    "kvt_lease_device_snapshot_row": (c_uint32, [c_void_p]),
    "kvt_reserve_with_device": (_status, [c_void_p, c_uint32, c_uint32, c_uint32,
                                          c_uint32, POINTER(c_void_p)]),
    "kvt_reservation_num_device_snapshot_rows": (c_uint32, [c_void_p]),
    "kvt_reservation_device_snapshot_rows": (_u32p, [c_void_p]),
    "kvt_commit_with_device": (_status, [c_void_p, _u8p, c_size_t, _u8p, c_size_t,
                                         POINTER(SnapshotPlacement), c_size_t,
                                         POINTER(SnapshotPlacement), c_size_t,
                                         POINTER(CommitResult)]),
    # Mirrors (c_api_mirror.cc).
    "kvt_mirror_create": (_status, [c_void_p, POINTER(Pool), POINTER(MirrorOptions),
                                    c_void_p, POINTER(c_void_p)]),
    "kvt_mirror_close": (None, [c_void_p]),
    "kvt_mirror_num_rows": (c_uint32, [c_void_p]),
    "kvt_mirror_rows": (_u32p, [c_void_p]),
    "kvt_mirror_reservation_id": (c_uint64, [c_void_p]),
    "kvt_mirror_store": (_status, [c_void_p, c_void_p, c_void_p, c_void_p]),
    "kvt_mirror_ensure": (_status, [c_void_p, c_void_p, c_void_p, c_void_p]),
    "kvt_mirror_store_drops": (c_void_p, [c_void_p]),
    "kvt_mirror_ensure_drops": (c_void_p, [c_void_p]),
    "kvt_mirror_revoked": (c_int32, [c_void_p]),
    "kvt_mirror_adopt": (_status, [c_void_p, _u32p, c_size_t, _u8p, c_size_t, _u8p,
                                   c_size_t, POINTER(CommitResult)]),
    "kvt_adopt_mirror": (_status, [c_void_p, c_void_p, _u32p, c_size_t, _u8p,
                                   c_size_t, _u8p, c_size_t, POINTER(CommitResult)]),
    # The cluster tier: remote lookups and prefetches (c_api.cc).
    "kvt_lookup_remote": (_status, [c_void_p, _u8p, c_size_t, c_int32,
                                    POINTER(c_void_p)]),
    "kvt_lease_remote_pages": (c_uint32, [c_void_p]),
    "kvt_lease_prefetching_pages": (c_uint32, [c_void_p]),
    "kvt_prefetch": (_status, [c_void_p, _u8p, c_size_t, POINTER(PrefetchResult)]),
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_path: str | None = None


def _repo_root() -> str:
    # python/kvtier/_lib.py -> the checkout's root (meaningless once installed).
    return os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))


def candidate_paths() -> list[str]:
    """Returns the places searched for libkvtier.so, in order (see module doc)."""
    out = []
    env = os.environ.get("KVTIER_LIB")
    if env:
        out.append(env)
    out.append(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "libkvtier.so"))
    kvt_bin = os.environ.get("KVT_BIN")
    if kvt_bin:
        out.append(os.path.join(kvt_bin, "client", "libkvtier.so"))
        out.append(os.path.join(kvt_bin, "libkvtier.so"))
    builds = glob.glob(os.path.join(_repo_root(), "build*", "client",
                                    "libkvtier.so"))
    builds.sort(key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0,
                reverse=True)
    out.extend(builds)
    return out


def library_path() -> str:
    """Returns the path of the libkvtier.so this process loaded (loading it)."""
    load()
    assert _lib_path is not None
    return _lib_path


def load() -> ctypes.CDLL:
    """Loads libkvtier.so (once) and returns it.

    Raises:
      OSError: naming every place searched when none holds a loadable library;
        when $KVTIER_LIB is set, only that path is tried.
    """
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            return _lib
        paths = candidate_paths()
        if os.environ.get("KVTIER_LIB"):
            paths = paths[:1]
        errors = []
        for path in paths:
            if not os.path.exists(path):
                errors.append(f"{path}: no such file")
                continue
            try:
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
            except OSError as e:
                errors.append(f"{path}: {e}")
                continue
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype = restype
                fn.argtypes = argtypes
            _lib, _lib_path = lib, os.path.realpath(path)
            return lib
        raise OSError("libkvtier.so not found or not loadable; set KVTIER_LIB. "
                      "Tried: " + "; ".join(errors))


def u8(data: bytes | None):
    """A uint8_t array holding a copy of `data`; None for None or b""."""
    if not data:
        return None
    return (c_uint8 * len(data)).from_buffer_copy(data)


def u32_array(values) -> ctypes.Array:
    """A fresh uint32_t array holding `values` (ints in [0, 2**32))."""
    values = list(values)
    for i, v in enumerate(values):
        if not 0 <= int(v) < 2**32:
            raise ValueError(f"index {i}: {v} is not a uint32")
    return (c_uint32 * len(values))(*values)
