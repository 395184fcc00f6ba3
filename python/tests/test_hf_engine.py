"""In-process tests of kvtier.hf.PrefixCachingEngine on a tiny random Llama:
chunk schedules, the engine's own pool as the first cache level, LRU eviction
from a sequence's end, and argument checks. The cross-process proofs are in
test_hf_proof.py."""

import pytest
import torch

from kvtier import hf

PAGE, CHUNK = 8, 32


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return hf.random_model("llama", "tiny", seed=3)


def engine(model, client, name, pool_pages=64):
    return hf.PrefixCachingEngine(model, client, name, tokens_per_page=PAGE,
                                  chunk_tokens=CHUNK, pool_pages=pool_pages,
                                  page_rows=256)


def prompt(n, seed):
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_probe_finds_attention_layers(model):
    spec = hf.probe_state_spec(model)
    assert spec.attn_layers == (0, 1) and not spec.hybrid
    assert (spec.kv_heads, spec.head_dim, spec.kv_dtype) == (2, 16, torch.bfloat16)


def test_schedule_cuts_at_chunk_multiples_and_extra_boundaries(model, client):
    e = engine(model, client, "schedule")
    assert e.schedule(0, 70) == [(0, 32), (32, 64), (64, 70)]
    assert e.schedule(40, 100) == [(40, 64), (64, 96), (96, 100)]
    assert e.schedule(0, 70, extra_boundaries=[40, 64, 90]) == [(0, 32), (32, 40), (40, 64), (64, 70)]
    with pytest.raises(ValueError, match="chunk_tokens"):
        hf.PrefixCachingEngine(model, client, "bad", tokens_per_page=8, chunk_tokens=12)


def test_the_pool_serves_a_repeat_and_kvtier_serves_it_after_eviction(model, client):
    e = engine(model, client, "levels")
    p = prompt(100, 1)
    first = e.prefill(p)
    assert first.resume_tokens == 0 and first.computed_tokens == 100
    assert first.stored_pages == 12 and not first.commit_errors

    again = e.prefill(p)  # 12 full pages before the last token: all in the pool
    assert (again.resume_tokens, again.gpu_hit_tokens, again.tier_hit_tokens) == (96, 96, 0)
    assert again.rehydrate_seconds is None

    e.clear_gpu_cache()
    tier = e.prefill(p)
    assert (tier.resume_tokens, tier.gpu_hit_tokens, tier.tier_hit_tokens) == (96, 0, 96)
    assert tier.rehydrated_bytes == 12 * e.pool.page_bytes
    assert tier.rehydrate_seconds is not None
    assert torch.equal(again.logits, tier.logits)  # same schedule from 96


def test_the_pool_evicts_a_sequence_from_its_end(model, client):
    e = engine(model, client, "lru", pool_pages=16)
    a, b = prompt(96, 2), prompt(64, 3)  # 12 and 8 pages; the pool holds 16
    e.prefill(a)
    e.prefill(b)
    assert e.gpu_resident_pages(a) == 8  # its last 4 pages went, not its first
    assert e.gpu_resident_pages(b) == 8
    r = e.prefill(a)  # the rest comes from kvtier
    assert (r.gpu_hit_tokens, r.tier_hit_tokens) == (64, 24)


def test_one_token_prompt_and_empty_prompt(model, client):
    e = engine(model, client, "short")
    r = e.prefill([5])
    assert (r.resume_tokens, r.computed_tokens, r.tier_matched_pages) == (0, 1, 0)
    assert r.logits.shape == (1, 256)
    with pytest.raises(ValueError, match="empty"):
        e.prefill([])


def test_sliding_window_models_are_rejected():
    from transformers import MistralConfig, MistralForCausalLM
    m = MistralForCausalLM(MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=16))
    with pytest.raises(ValueError, match="layer 0: sliding-window caches"):
        hf.probe_state_spec(m)
