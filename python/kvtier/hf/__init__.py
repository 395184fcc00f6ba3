"""Reference integration with Hugging Face transformers: a persistent prefix
cache for causal LMs whose cache is a DynamicCache, attention-only (Llama) or
hybrid (Qwen3-Next: Gated DeltaNet layers with conv and recurrent states
beside full-attention layers).

PrefixCachingEngine (engine.py) is a minimal paged serving loop around a
transformers model, the shape an engine integration takes; PagedKVPool
(pool.py) is its own paged KV pool and snapshot slots; model.py finds what
a model keeps per request (probe_state_spec), runs it on a DynamicCache
(forward) and builds seeded random models for tests and benchmarks
(random_model). Because kvtier's daemon owns the rows, a new process with
the same model and namespace finds every prefix an earlier process stored.

    from kvtier import hf
    model = hf.random_model("llama", "tiny")
    engine = hf.PrefixCachingEngine(model, client, "llama-tiny")
    result = engine.prefill(tokens)       # logits, hit and stored counts

This package relies on transformers 5.x cache internals (DynamicLayer.keys/
values, LinearAttentionLayer.conv_states/recurrent_states/has_previous_state);
python/requirements.txt pins the tested version. torch is imported with the
package, transformers only by the calls that need it.

Thread-safety: an engine serves one request at a time (not thread-safe).
"""

from .engine import PrefillResult, PrefixCachingEngine
from .model import (StateSegment, StateSpec, forward, new_cache, probe_state_spec,
                    random_model)
from .pool import PagedKVPool

__all__ = [
    "PagedKVPool", "PrefillResult", "PrefixCachingEngine", "StateSegment",
    "StateSpec", "forward", "new_cache", "probe_state_spec", "random_model",
]
