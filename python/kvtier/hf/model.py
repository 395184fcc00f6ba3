"""The model side of the transformers integration: what a causal LM keeps
per request (StateSpec: KV of its attention layers, recurrent-state
segments of its linear-attention layers, found by probe_state_spec), one
forward pass on a DynamicCache (new_cache, forward), and models with seeded
random weights built from a config for tests and benchmarks (random_model).

This module relies on transformers 5.x cache internals (DynamicLayer.keys/
values, LinearAttentionLayer.conv_states/recurrent_states); transformers is
imported by the functions that need it.

Thread-safety: pure functions and immutable dataclasses; a model and a
cache are used by one thread at a time.
"""

from __future__ import annotations

import dataclasses
import inspect

import torch


@dataclasses.dataclass(frozen=True)
class StateSegment:
    """One recurrent-state tensor of one layer (batch dimension dropped)."""
    layer: int
    kind: str  # "conv" or "recurrent"
    index: int  # state_idx within the layer
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """What a model keeps per request: KV of attention layers (per token) and
    recurrent-state segments of linear-attention layers (per request)."""
    attn_layers: tuple[int, ...]
    kv_heads: int
    head_dim: int
    kv_dtype: torch.dtype
    states: tuple[StateSegment, ...]
    num_layers: int

    @property
    def hybrid(self) -> bool:
        return bool(self.states)


def _cache_kwarg(model) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def new_cache(model):
    """An empty DynamicCache laid out for `model`'s layer types."""
    from transformers import DynamicCache
    return DynamicCache(config=model.config)


@torch.no_grad()
def forward(model, tokens: torch.Tensor, cache, keep_all: bool = False) -> torch.Tensor:
    """Runs `tokens` (1-D) through `model` on top of `cache` (updated in
    place) and returns the logits [len(tokens), vocab] (keep_all) or of the
    last position only [1, vocab]."""
    out = model(input_ids=tokens[None], use_cache=True,
                logits_to_keep=0 if keep_all else 1,
                **{_cache_kwarg(model): cache})
    return out.logits[0]


@torch.no_grad()
def probe_state_spec(model) -> StateSpec:
    """Finds which layers keep KV and which keep recurrent state, and their
    shapes, by running one token through `model` on a fresh cache.

    Raises ValueError for caches this integration does not handle (sliding
    windows, attention layers of different shapes).
    """
    from transformers.cache_utils import (DynamicLayer,
                                          DynamicSlidingWindowLayer,
                                          LinearAttentionCacheLayerMixin)
    device = next(model.parameters()).device
    cache = new_cache(model)
    forward(model, torch.zeros(1, dtype=torch.long, device=device), cache)
    attn, states, kv = [], [], set()
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, DynamicSlidingWindowLayer):
            raise ValueError(f"layer {i}: sliding-window caches are not supported")
        if isinstance(layer, DynamicLayer) and layer.keys is not None:
            _, h, _, d = layer.keys.shape
            kv.add((h, d, layer.keys.dtype))
            attn.append(i)
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            for s in range(layer.number_of_states):
                for kind, t in (("conv", layer.conv_states[s]),
                                ("recurrent", layer.recurrent_states[s])):
                    if t is not None:
                        states.append(StateSegment(i, kind, s, tuple(t.shape[1:]), t.dtype))
    if len(kv) > 1:
        raise ValueError(f"attention layers differ in KV shape: {sorted(map(str, kv))}")
    if not attn:
        raise ValueError("the model keeps no KV in its cache")
    h, d, dt = kv.pop()
    return StateSpec(tuple(attn), h, d, dt, tuple(states), len(cache.layers))


def random_model(arch: str, size: str = "tiny", *, seed: int = 0,
                 dtype: torch.dtype = torch.bfloat16, device="cpu"):
    """A causal LM with seeded random weights built from a config (nothing
    downloaded), for tests and benchmarks.

    arch: "llama" (attention only) or "qwen3_next" (hybrid Gated DeltaNet).
    size: "tiny" (a few hundred thousand parameters, for CPU tests) or "1b"
      (about a billion, for the GPU churn benchmark).
    The same (arch, size, seed, dtype) gives the same weights in every
    process on the same device type.
    """
    from transformers import (LlamaConfig, LlamaForCausalLM, Qwen3NextConfig,
                              Qwen3NextForCausalLM)
    if arch == "llama":
        if size == "tiny":
            cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16)
        elif size == "1b":  # Llama-3.2-1B's shape with a 32k vocabulary
            cfg = dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192,
                       num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=64, rope_theta=500000.0)
        else:
            raise ValueError(f"size: {size!r} is not 'tiny' or '1b'")
        config, cls = LlamaConfig(max_position_embeddings=131072, **cfg), LlamaForCausalLM
    elif arch == "qwen3_next":
        if size == "tiny":
            n = 4
            cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       linear_num_value_heads=4, linear_num_key_heads=2,
                       linear_key_head_dim=16, linear_value_head_dim=16,
                       num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=32)
        elif size == "1b":  # Qwen3-Next's 3:1 pattern, dense MLPs
            n = 16
            cfg = dict(vocab_size=32000, hidden_size=2048, intermediate_size=6144,
                       num_attention_heads=16, num_key_value_heads=4, head_dim=128,
                       linear_num_value_heads=16, linear_num_key_heads=8,
                       linear_key_head_dim=128, linear_value_head_dim=128,
                       mlp_only_layers=list(range(n)), num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=256,
                       shared_expert_intermediate_size=256)
        else:
            raise ValueError(f"size: {size!r} is not 'tiny' or '1b'")
        layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                       for i in range(n)]
        config = Qwen3NextConfig(num_hidden_layers=n, layer_types=layer_types,
                                 linear_conv_kernel_dim=4,
                                 max_position_embeddings=131072, **cfg)
        cls = Qwen3NextForCausalLM
    else:
        raise ValueError(f"arch: {arch!r} is not 'llama' or 'qwen3_next'")
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(config)
    return model.to(dtype).eval()
