"""What the connector refuses at start, and that each refusal names the
setting to change (docs/vllm.md, "Configuration"): checked against the
installed vLLM's own helpers and spec classes, without an engine.

- prefix_caching_hash_algo xxhash without PYTHONHASHSEED
- prefix caching off
- pipeline stages of unequal layers (vLLM's own get_pp_indices split), and
  of different layer kinds
- TP x PP above 64, and MLA with PP > 1
- a KV cache group of a kind kvtier cannot store (vLLM's spec classes)
- speculative decoding with a hybrid model
"""

import os
import types

import pytest

from kvtier.vllm.connector import check_cache, check_engine, describe_cache
from kvtier.vllm.layout import CacheDescription, Group, Placement, Ranks


def engine_config(tp=1, pp=1, layers=8, algo="sha256", prefix=True, layer_types=None):
    text = types.SimpleNamespace(num_hidden_layers=layers, layer_types=layer_types)
    return types.SimpleNamespace(
        cache_config=types.SimpleNamespace(prefix_caching_hash_algo=algo,
                                           enable_prefix_caching=prefix),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=tp,
                                              pipeline_parallel_size=pp),
        model_config=types.SimpleNamespace(hf_text_config=text))


def test_supported_shapes_pass():
    check_engine(engine_config())
    check_engine(engine_config(tp=8, pp=2, layers=80))
    check_engine(engine_config(pp=2, layers=8,
                               layer_types=["linear", "linear", "linear", "full"] * 2))


def test_hash_seed_and_prefix_caching(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(ValueError, match="PYTHONHASHSEED"):
        check_engine(engine_config(algo="xxhash"))
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    check_engine(engine_config(algo="xxhash"))
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        check_engine(engine_config(prefix=False))


def test_uneven_pipeline_stages_name_the_settings(monkeypatch):
    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION", raising=False)
    with pytest.raises(ValueError, match=r"pipeline_parallel_size=2 splits the "
                       r"model's 7 layers into stages of \[4, 3\].*"
                       r"VLLM_PP_LAYER_PARTITION"):
        check_engine(engine_config(pp=2, layers=7))
    with pytest.raises(ValueError, match="of different kinds"):
        check_engine(engine_config(pp=2, layers=8,
                                   layer_types=["linear"] * 3 + ["full"] + ["linear"] * 4))


def test_parallel_limits_name_the_settings():
    with pytest.raises(ValueError, match="tensor_parallel_size x pipeline_parallel_size"):
        Ranks(16, 8)
    with pytest.raises(ValueError, match="pipeline_parallel_size=2 with KV"):
        Ranks(4, 2, replicated=True)


def test_group_kinds_kvtier_cannot_store_are_refused():
    import torch
    from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec,
                                            FullAttentionSpec, KVCacheConfig,
                                            KVCacheGroupSpec, KVCacheTensor)
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64,
                             dtype=torch.bfloat16)
    local = ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=2, head_size=64,
                                      dtype=torch.bfloat16, attention_chunk_size=64)
    page = full.page_size_bytes
    config = KVCacheConfig(
        num_blocks=8,
        kv_cache_tensors=[KVCacheTensor(size=8 * page, layers=["a", "c"],
                                        layer_stride=0, block_stride=page)],
        kv_cache_groups=[KVCacheGroupSpec(["a"], full), KVCacheGroupSpec(["c"], local)])
    with pytest.raises(ValueError, match="cannot store"):
        describe_cache(config, "bfloat16")


def test_speculative_decoding_with_a_hybrid_model_names_the_setting():
    p = Placement(("a", "m"), 0, 4096, 4096)
    hybrid = CacheDescription(8, (p,), (Group("attention", 16, ("a",)),
                                        Group("mamba", 16, ("m",))), 16, "bfloat16")
    plain = CacheDescription(8, (p,), (Group("attention", 16, ("a", "m")),), 16,
                             "bfloat16")
    ngram = types.SimpleNamespace(speculative_config={"method": "ngram"})
    check_cache(ngram, plain)
    check_cache(types.SimpleNamespace(speculative_config=None), hybrid)
    with pytest.raises(ValueError, match="speculative_config with a hybrid model"):
        check_cache(ngram, hybrid)
