"""Tiny models for the vLLM suite and benchmark: configs with seeded random
weights written by transformers, so nothing is downloaded.

Thread-safety: plain functions.
"""

import json
import os
import tempfile

PROMPT = [(i * 7) % 997 + 1 for i in range(1100)]

CONFIGS = {
    "llama": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16", "tie_word_embeddings": False},
    # Linear-attention head dims of 64: the CPU GDN kernel refuses 32.
    "qwen3_next": {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2,
        "full_attention_interval": 2, "vocab_size": 1000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16", "linear_num_key_heads": 2,
        "linear_num_value_heads": 2, "linear_key_head_dim": 64,
        "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1,
        "norm_topk_prob": True, "tie_word_embeddings": False},
}
# vLLM's grouping of a full-size Qwen3-Next (a full-attention layer every
# 4th): 8 layers give 1 attention group and 3 Mamba groups of 2 layers each.
CONFIGS["qwen3_next_8"] = dict(CONFIGS["qwen3_next"], num_hidden_layers=8,
                               full_attention_interval=4)

# A sliding-window model: Gemma 3's text stack with a 256-token window on 3
# of its 4 layers; vLLM groups it as 3 sliding-window groups and 1
# full-attention group.
CONFIGS["gemma3"] = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 4,
    "vocab_size": 1000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16", "sliding_window": 256,
    "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    "query_pre_attn_scalar": 32, "rope_theta": 10000.0,
    "rope_local_base_freq": 10000.0, "tie_word_embeddings": True}


def make_model(arch: str, folder: str | None = None, weights: bool = True,
               **overrides) -> str:
    """A folder holding a tiny model of `arch`: config.json and, with
    `weights`, seeded random weights (transformers' initialisation with a
    wide range, so that the logprobs are far from uniform and wrong KV shows
    in them; vLLM's dummy loader gives near-uniform ones). overrides change
    config.json only."""
    folder = folder or tempfile.mkdtemp(prefix=f"kvtier-{arch}-")
    config = dict(CONFIGS[arch], initializer_range=0.2, **overrides)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    if weights:
        import torch
        import transformers
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.from_pretrained(folder), dtype=torch.bfloat16)
        model.save_pretrained(folder)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)  # as written above, whatever save_pretrained wrote
    return folder
