"""The connector's contract with the installed vLLM, without an engine: run
in every venv that holds a vLLM the connector claims (docs/vllm.md, "Tested
vLLM versions"), so that a vLLM release that renames a hook, changes a
signature or drops a type the connector builds fails here, not in a user's
engine.

- every abstract method of KVConnectorBase_V1, SupportsHMA and
  KVConnectorWorkerMetadata is implemented by the connector's classes, with
  the parameters vLLM passes (names and kinds; vLLM calls some by keyword);
- the optional hooks the connector overrides still exist in the base class
  with the same parameters (an override of a hook vLLM dropped is dead code);
- the types the connector constructs or reads (KVConnectorTransferResults,
  BlockStored, the KV cache specs and KVCacheTensor / KVCacheConfig fields,
  vLLM's parallel-state and pipeline helpers) have what it uses.
"""

import dataclasses
import inspect

import pytest

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1 import base

from kvtier.vllm.connector import (KvtierConnector, KvtierConnectorStats,
                                   KvtierMetadata, KvtierWorkerMetadata)

# The base hooks the connector overrides beyond the abstract ones.
OPTIONAL_HOOKS = ("register_kv_caches", "get_transfer_results",
                  "build_connector_worker_meta", "get_kv_connector_stats",
                  "build_kv_connector_stats", "shutdown", "update_connector_output",
                  "request_finished", "take_events", "reset_cache",
                  "get_required_kvcache_layout", "requires_kv_delivery")


def abstract_methods(cls):
    return sorted(n for n, f in inspect.getmembers(cls)
                  if getattr(f, "__isabstractmethod__", False))


def params(fn):
    """(name, kind) of each parameter but self/cls."""
    sig = inspect.signature(fn)
    return [(p.name, p.kind) for p in sig.parameters.values()
            if p.name not in ("self", "cls")]


def check_same_call(ours, theirs, name):
    """vLLM may call `name` with any of its parameters by keyword, or pass
    **kwargs: ours must take the same names in the same order and kinds."""
    assert params(ours) == params(theirs), (
        f"{name}: vLLM {vllm.__version__} declares {inspect.signature(theirs)}, "
        f"the connector {inspect.signature(ours)}")


@pytest.mark.parametrize("cls, ours", [
    (base.KVConnectorBase_V1, KvtierConnector),
    (base.SupportsHMA, KvtierConnector),
    (base.KVConnectorWorkerMetadata, KvtierWorkerMetadata),
])
def test_every_abstract_method_is_implemented_with_vllms_parameters(cls, ours):
    missing = [m for m in abstract_methods(cls)
               if getattr(getattr(ours, m), "__isabstractmethod__", False)]
    assert not missing, f"vLLM {vllm.__version__}: {ours.__name__} lacks {missing}"
    assert not abstract_methods(ours), abstract_methods(ours)
    for m in abstract_methods(cls):
        check_same_call(getattr(ours, m), getattr(cls, m), f"{cls.__name__}.{m}")


def test_overridden_hooks_exist_in_vllm_with_the_same_parameters():
    for name in OPTIONAL_HOOKS:
        theirs = inspect.getattr_static(base.KVConnectorBase_V1, name, None)
        assert theirs is not None, f"vLLM {vllm.__version__} has no hook {name}"
        ours = inspect.getattr_static(KvtierConnector, name)
        if isinstance(theirs, property):
            assert isinstance(ours, property), name
            continue
        if isinstance(theirs, (classmethod, staticmethod)):
            assert type(ours) is type(theirs), name
            theirs, ours = theirs.__func__, ours.__func__
        check_same_call(ours, theirs, name)


def test_the_types_the_connector_builds_and_reads():
    assert issubclass(KvtierMetadata, base.KVConnectorMetadata)
    assert issubclass(KvtierWorkerMetadata, base.KVConnectorWorkerMetadata)
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
    assert issubclass(KvtierConnectorStats, KVConnectorStats)
    results = base.KVConnectorTransferResults(finished_recving={"a"},
                                              failed_recving={"a"})
    assert results.finished_recving == {"a"}
    from vllm.distributed.kv_events import BlockStored
    BlockStored(block_hashes=[b"h"], parent_block_hash=None, token_ids=[1],
                block_size=16, lora_id=None, medium="CPU", lora_name=None)
    from vllm.v1 import kv_cache_interface as kci
    for spec in ("FullAttentionSpec", "MambaSpec", "SlidingWindowSpec"):
        assert hasattr(kci, spec), spec
    assert {"sliding_window", "block_size"} <= {
        f.name for f in dataclasses.fields(kci.SlidingWindowSpec)}
    assert {"size", "layers", "layer_stride", "block_stride", "offset"} <= {
        f.name for f in dataclasses.fields(kci.KVCacheTensor)}
    assert {"num_blocks", "kv_cache_tensors", "kv_cache_groups"} <= {
        f.name for f in dataclasses.fields(kci.KVCacheConfig)}
    from vllm.distributed import parallel_state
    from vllm.distributed.utils import get_pp_indices
    assert callable(parallel_state.get_tp_group) and callable(parallel_state.get_pp_group)
    assert get_pp_indices(8, 1, 2) == (4, 8)
