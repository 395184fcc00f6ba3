"""kvtier: Python bindings of libkvtier, the per-node host-memory tier for LLM
KV caches (and recurrent-state snapshots of hybrid models).

The package calls libkvtier.so's C ABI through ctypes (no compiled extension:
one build serves every Python version). torch is needed only for TorchPool
and CUDA streams; transformers only for kvtier.hf.

    import kvtier
    pool = kvtier.TorchPool({"kv": kvtier.kv_pool_tensors(kv_caches)})
    with kvtier.Client(socket="/run/kvtier/kvtierd.sock") as client:
        ns = client.attach("llama-8b", pool.layout(model="llama-8b"))
        xfer = ns.transfer(pool)             # CUDA tensors: the CUDA backend
        lease = ns.lookup(ns.hash_tokens(prompt))
        xfer.rehydrate(free_pages[:lease.usable_pages], lease.rows)
        lease.release(torch.cuda.current_stream())

Sparse-attention offload: Namespace.mirror (kvtier.mirror); the daemon's
device pools: Namespace.open_device_pool (kvtier.device_pool).

See docs/python.md. Thread-safety: see kvtier.client.
"""

from ._lib import library_path
from .client import (BankInfo, BankLayout, Client, CommitResult, Layout, Lease,
                     Namespace, PendingCommit, PoolDescriptor, PoolTensorSpec,
                     PrefetchResult, Reservation, Transfer)
from .daemon import Daemon, find_kvtierd
from .device_pool import DevicePool, DevicePoolInfo, cuda_tensor
from .errors import (AbortedError, AlreadyExistsError, CancelledError,
                     DataLossError, DeadlineExceededError,
                     FailedPreconditionError, InternalError,
                     InvalidArgumentError, KvtierError, NotFoundError,
                     OutOfRangeError, PermissionDeniedError,
                     ResourceExhaustedError, UnauthenticatedError,
                     UnavailableError, UnimplementedError, UnknownError)
from .mirror import Mirror, mirror_entries
from .torch_pool import TorchPool, kv_pool_tensors, tensor_spec

__version__ = "0.1.0"

__all__ = [
    "AbortedError", "AlreadyExistsError", "BankInfo", "BankLayout",
    "CancelledError", "Client", "CommitResult", "Daemon", "DataLossError",
    "DeadlineExceededError", "DevicePool", "DevicePoolInfo",
    "FailedPreconditionError", "InternalError", "InvalidArgumentError",
    "KvtierError", "Layout", "Lease", "Mirror", "Namespace",
    "NotFoundError", "OutOfRangeError", "PendingCommit",
    "PermissionDeniedError", "PoolDescriptor", "PoolTensorSpec",
    "PrefetchResult", "Reservation", "ResourceExhaustedError", "TorchPool", "Transfer",
    "UnauthenticatedError", "UnavailableError", "UnimplementedError",
    "UnknownError", "cuda_tensor", "find_kvtierd", "kv_pool_tensors",
    "library_path", "library_version", "mirror_entries", "tensor_spec",
]


def library_version() -> str:
    """kvt_version() of the loaded libkvtier.so, e.g. "0.1.0"."""
    from . import _lib
    return _lib.load().kvt_version().decode()
