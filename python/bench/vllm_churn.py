"""The churn scenario through vLLM, with kvtier against without. Prints JSON.

An agent's long conversation is computed (turn 1); auxiliary requests then
evict it from vLLM's own prefix cache (a KV cache sized to hold little more
than one of them); the next turn arrives. Without kvtier vLLM recomputes the
whole conversation; with kvtier the connector loads it from the host tier.
The same next turn is then served by a restarted vLLM (a new process, same
configuration): without kvtier everything is recomputed again, with kvtier
it is loaded again. Reported per mode: time to first token of the next turn
(llm.generate with max_tokens=1, timed in the engine process) and vLLM's
num_cached_tokens. Target: with kvtier <= 1/5 of without, both times.

Every engine is its own process (python/tests_vllm/engine.py), the model a
random-weight Llama written locally (nothing downloaded), sized so that
recomputing the conversation takes seconds on a CPU; --arch qwen3_next the
hybrid shape instead (Qwen3-Next's grouping: 8 layers, a full-attention
layer every 4th, so 1 attention and 3 Mamba groups, mamba_cache_mode
"align"); --tp N runs every engine at tensor_parallel_size N (vLLM's
multiprocessing executor, one OMP thread per rank).

    $(BUILD)/venv-vllm/bin/python python/bench/vllm_churn.py --out churn.json
    $(BUILD)/venv-vllm/bin/python python/bench/vllm_churn.py --tp 2 --out tp2.json
    $(BUILD)/venv-vllm/bin/python python/bench/vllm_churn.py --arch qwen3_next
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY_ROOT = os.path.dirname(HERE)
TESTS = os.path.join(PY_ROOT, "tests_vllm")
sys.path.insert(0, PY_ROOT)
sys.path.insert(0, TESTS)

import kvtier  # noqa: E402
from models import CONFIGS, make_model  # noqa: E402

# ~50M parameters: a 4k-token prefill takes seconds on two cores.
MODEL = {"hidden_size": 768, "intermediate_size": 2048, "num_attention_heads": 12,
         "num_key_value_heads": 4, "num_hidden_layers": 8, "vocab_size": 8000,
         "max_position_embeddings": 8192}
# The hybrid shape: Qwen3-Next's grouping at 8 layers (1 attention group, 3
# Mamba groups), wide enough that a 4k-token prefill takes seconds.
HYBRID = dict(CONFIGS["qwen3_next_8"], hidden_size=512, intermediate_size=1024,
              moe_intermediate_size=256, shared_expert_intermediate_size=256,
              num_attention_heads=8, num_key_value_heads=2, head_dim=64,
              linear_num_key_heads=4, linear_num_value_heads=8,
              vocab_size=8000, max_position_embeddings=8192)


def run_engine(script: dict, env: dict) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        path, out = os.path.join(tmp, "s.json"), os.path.join(tmp, "s.out")
        with open(path, "w") as f:
            json.dump(script, f)
        log = os.path.join(tmp, "log")
        with open(log, "w") as lf:
            rc = subprocess.call([sys.executable, os.path.join(TESTS, "engine.py"),
                                  path, out], stdout=lf, stderr=subprocess.STDOUT,
                                 env=env)
        if rc != 0:
            sys.stderr.write(open(log).read()[-5000:])
            raise SystemExit(f"engine exited {rc}")
        with open(out) as f:
            return [json.loads(l) for l in f if l.strip() and '"ready"' not in l]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=4000, help="conversation tokens")
    ap.add_argument("--turn", type=int, default=64, help="new tokens of the next turn")
    ap.add_argument("--aux", type=int, default=6, help="auxiliary requests")
    ap.add_argument("--aux-tokens", type=int, default=1500)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--arch", choices=("llama", "qwen3_next"), default="llama")
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    ap.add_argument("--out")
    args = ap.parse_args()
    shape = MODEL if args.arch == "llama" else HYBRID
    bs = args.block_size
    # vLLM's own cache: the auxiliary batch alone fills it (so the
    # conversation is evicted), but one request of max_model_len must fit.
    max_model_len = args.context + 16 + args.turn + 128
    blocks = max(-(-max_model_len // bs), (args.aux * args.aux_tokens) // bs)
    vocab = shape["vocab_size"]
    conv = [(i * 7919) % (vocab - 10) + 5 for i in range(args.context)]
    reply = [(i * 31) % (vocab - 10) + 5 for i in range(16)]
    turn2 = conv + reply + [(i * 17) % (vocab - 10) + 5 for i in range(args.turn)]
    aux = [[(j * 1009 + i * 13) % (vocab - 10) + 5 for i in range(args.aux_tokens)]
           for j in range(1, args.aux + 1)]
    model = make_model("llama" if args.arch == "llama" else "qwen3_next_8", **shape)
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    if args.tp > 1:  # one OMP thread per rank, ranks on distinct CPUs
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(
            str(i % (os.cpu_count() or 1)) for i in range(args.tp)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PY_ROOT, env.get("PYTHONPATH")) if p)
    results = {"machine": f"{os.cpu_count()} CPUs, vLLM CPU backend",
               "model": dict(shape, arch=args.arch, weights="random bf16"),
               "tensor_parallel_size": args.tp,
               "context_tokens": args.context, "next_turn_tokens": len(turn2),
               "aux_requests": args.aux, "aux_tokens": args.aux_tokens,
               "vllm_cache_blocks": blocks, "block_size": bs, "modes": {}}

    def gen(prompt, **kw):
        return dict({"op": "generate", "prompt": prompt, "max_tokens": 1,
                     "logprobs": 20}, **kw)

    with kvtier.Daemon(flags=["--default_namespace_bytes=1073741824"]) as d:
        for mode in ("without_kvtier", "with_kvtier"):
            base = {"arch": "llama" if args.arch == "llama" else "qwen3_next_8",
                    "model": model, "tp": args.tp, "compile": True,
                    "max_model_len": max_model_len,
                    "num_gpu_blocks_override": blocks, "block_size": bs,
                    "max_num_batched_tokens": 8192,
                    "socket": d.socket if mode == "with_kvtier" else None}
            first = run_engine(dict(base, steps=[
                gen(conv, max_tokens=16),
                {"op": "generate_many", "prompts": aux},
                gen(turn2)]), env)
            restarted = run_engine(dict(base, steps=[gen(turn2)]), env)
            results["modes"][mode] = {
                "turn1_seconds": first[0]["seconds"],
                "next_turn_ttft_s": first[2]["seconds"],
                "next_turn_cached_tokens": first[2]["num_cached_tokens"],
                "after_restart_ttft_s": restarted[0]["seconds"],
                "after_restart_cached_tokens": restarted[0]["num_cached_tokens"]}
    w, k = results["modes"]["without_kvtier"], results["modes"]["with_kvtier"]
    results["next_turn_speedup"] = w["next_turn_ttft_s"] / k["next_turn_ttft_s"]
    results["after_restart_speedup"] = w["after_restart_ttft_s"] / k["after_restart_ttft_s"]
    results["target_met"] = (k["next_turn_ttft_s"] <= w["next_turn_ttft_s"] / 5 and
                             k["after_restart_ttft_s"] <= w["after_restart_ttft_s"] / 5)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
