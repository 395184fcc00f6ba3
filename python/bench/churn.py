#!/usr/bin/env python3
"""The churn scenario (issue 7): a long conversation, auxiliary requests that
evict it from the engine's GPU cache, then the conversation's next turn —
time to first token with kvtier against a full recompute. Prints one JSON
object.

    source .device/env.sh   # $KVT_BIN: libkvtier.so and kvtierd of a CUDA build
    python3 python/bench/churn.py --arch llama --size 1b

Steps, on a random-weight model built from a config (nothing downloaded):
  1. warm-up (kernels, cuBLAS, the tier's copy kernel), not timed;
  2. turn 1: chunked prefill of --context tokens; every chunk's pages (and,
     hybrid, a snapshot at each boundary) go to the GPU pool and kvtier;
  3. --aux auxiliary requests of --aux-tokens distinct tokens each, which the
     pool (sized for the conversation plus one auxiliary request) can only
     hold by evicting the conversation;
  4. turn 2 (conversation + --turn new tokens) with kvtier: lookup, rehydrate
     the conversation into the pool on the current stream, compute only the
     new tokens: TTFT, cached tokens, bytes and GB/s of the rehydration;
  5. the same prompt fully recomputed, with the same chunk boundaries:
     TTFT, and whether its logits equal the tiered run's bit for bit;
  6. --repeats more of 4 and 5 (the GPU cache cleared before each tiered
     run), reported as medians;
  7. the D2H rate of one eviction of the conversation's pages (reserved rows,
     then aborted).
Turn 2 and its repeats do not store their new pages (store=False), so every
tiered run sees the same tier contents; the recompute stores nothing either.

The daemon is a private kvtierd (kvtier.Daemon) unless --socket names one.
Runs on the CPU too (--device cpu --size tiny, for a smoke test).

Thread-safety: a single-threaded script.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import kvtier  # noqa: E402
from kvtier import hf  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="llama", choices=["llama", "qwen3_next"])
    ap.add_argument("--size", default="1b", choices=["tiny", "1b"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context", type=int, default=24576, help="turn 1's tokens")
    ap.add_argument("--turn", type=int, default=512, help="turn 2's new tokens")
    ap.add_argument("--aux", type=int, default=10, help="auxiliary requests")
    ap.add_argument("--aux-tokens", type=int, default=3072)
    ap.add_argument("--chunk", type=int, default=2048, help="prefill chunk")
    ap.add_argument("--page", type=int, default=16, help="tokens per page")
    ap.add_argument("--repeats", type=int, default=3, help="turn-2 measurements")
    ap.add_argument("--max-ctas", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--socket", default=None, help="an existing kvtierd")
    ap.add_argument("--daemon-dir", default=None,
                    help="where the private kvtierd keeps its banks (default /dev/shm)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    return ap.parse_args(argv)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device, fn):
    sync(device)
    t0 = time.perf_counter()
    r = fn()
    sync(device)
    return r, time.perf_counter() - t0


def run(args, client) -> dict:
    device = torch.device(args.device)
    t0 = time.perf_counter()
    model = hf.random_model(args.arch, args.size, seed=args.seed, device=device)
    params = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    build_s = time.perf_counter() - t0

    p, total = args.page, args.context + args.turn
    # Room for the conversation and one auxiliary request: the auxiliary
    # requests together push the whole conversation out (reported below).
    pool_pages = math.ceil(total / p) + math.ceil(args.aux_tokens / p) + 2
    stored_tokens = args.context + args.aux * args.aux_tokens + 4 * args.chunk
    page_rows = math.ceil(stored_tokens / p * 1.25) + math.ceil(total / p)
    snapshot_rows = 2 * (math.ceil(stored_tokens / args.chunk) + args.aux + 4)
    name = f"churn-{args.arch}-{args.size}-{args.seed}-{os.getpid()}"
    t0 = time.perf_counter()
    engine = hf.PrefixCachingEngine(
        model, client, name, tokens_per_page=p, chunk_tokens=args.chunk,
        pool_pages=pool_pages, snapshot_slots=4, page_rows=page_rows,
        snapshot_rows=snapshot_rows, max_ctas=args.max_ctas)
    attach_s = time.perf_counter() - t0

    g = torch.Generator().manual_seed(args.seed + 1)

    def rand(n):
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    conversation, turn = rand(args.context), rand(args.turn)
    aux = [rand(args.aux_tokens) for _ in range(args.aux)]
    prompt = conversation + turn

    # 1. Warm-up, through the tier too (the copy kernel's first launch).
    warm = rand(2 * args.chunk)
    engine.prefill(warm)
    engine.clear_gpu_cache()
    engine.prefill(warm + rand(args.page))
    engine.prefill(rand(args.chunk), use_tier=False, store=False, use_gpu_cache=False)
    engine.clear_gpu_cache()

    # 2. Turn 1.
    r1, turn1_s = timed(device, lambda: engine.prefill(conversation))
    # 3. Auxiliary requests.
    _, aux_s = timed(device, lambda: [engine.prefill(a) for a in aux])
    resident_after_aux = engine.gpu_resident_pages(conversation) * p

    # 4-6. Turn 2 with the tier against a full recompute.
    runs = []
    for i in range(args.repeats):
        if i:
            engine.clear_gpu_cache()
        tier, tier_s = timed(device, lambda: engine.prefill(prompt, store=False))
        rehydrate_s = tier.rehydrate_seconds
        full, full_s = timed(device, lambda: engine.prefill(
            prompt, use_gpu_cache=False, use_tier=False, store=False,
            extra_boundaries=[tier.resume_tokens]))
        a, b = tier.logits.float(), full.logits.float()
        runs.append({
            "ttft_tier_s": tier_s, "ttft_recompute_s": full_s,
            "cached_tokens": tier.resume_tokens,
            "tier_hit_tokens": tier.tier_hit_tokens,
            "gpu_hit_tokens": tier.gpu_hit_tokens,
            "computed_tokens": tier.computed_tokens,
            "recomputed_tokens": full.computed_tokens,
            "rehydrated_bytes": tier.rehydrated_bytes,
            "rehydrate_s": rehydrate_s,
            "rehydrate_gbps": (tier.rehydrated_bytes / rehydrate_s / 1e9
                               if rehydrate_s else None),
            "logits_bit_identical": bool(torch.equal(tier.logits, full.logits)),
            "logits_max_abs_diff": float((a - b).abs().max()),
            "argmax_match": bool(a.argmax(-1).eq(b.argmax(-1)).all()),
        })

    # 7. One eviction of the conversation's pages, D2H (rows aborted after).
    pages = min(math.ceil(args.context / p), pool_pages)
    evict_s = evict_gbps = None
    try:
        res = engine.ns.reserve(pages)
        try:
            sync(device)
            start = time.perf_counter()
            if device.type == "cuda":
                ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                ev0.record()
                engine.xfer.evict(list(range(pages)), res.page_rows)
                ev1.record()
                ev1.synchronize()
                evict_s = ev0.elapsed_time(ev1) / 1e3
            else:
                engine.xfer.evict(list(range(pages)), res.page_rows)
                evict_s = time.perf_counter() - start
            evict_gbps = pages * engine.pool.page_bytes / evict_s / 1e9
        finally:
            res.abort()
    except kvtier.KvtierError as e:
        evict_gbps = f"not measured: {e}"

    def med(key):
        vals = [r[key] for r in runs if r[key] is not None]
        return statistics.median(vals) if vals else None

    first = runs[0]
    return {
        "scenario": "churn",
        "arch": args.arch, "size": args.size, "params": params,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": "bfloat16",
        "context_tokens": args.context, "turn_tokens": args.turn,
        "aux_requests": args.aux, "aux_tokens": args.aux_tokens,
        "chunk_tokens": args.chunk, "tokens_per_page": p,
        "page_bytes": engine.pool.page_bytes,
        "snapshot_bytes": engine.pool.torch_pool.snapshot_row_bytes,
        "gpu_pool_pages": pool_pages,
        "gpu_resident_tokens_after_aux": resident_after_aux,
        "turn1_s": turn1_s, "turn1_stored_pages": r1.stored_pages,
        "turn1_stored_snapshots": r1.stored_snapshots,
        "turn1_commit_errors": len(r1.commit_errors),
        "aux_s": aux_s,
        "ttft_tier_s": med("ttft_tier_s"),
        "ttft_recompute_s": med("ttft_recompute_s"),
        "speedup": (med("ttft_recompute_s") / med("ttft_tier_s")
                    if med("ttft_tier_s") else None),
        "cached_tokens": first["cached_tokens"],
        "tier_hit_tokens": first["tier_hit_tokens"],
        "computed_tokens_tier": first["computed_tokens"],
        "rehydrated_bytes": first["rehydrated_bytes"],
        "rehydrate_s": med("rehydrate_s"),
        "rehydrate_gbps": med("rehydrate_gbps"),
        "evict_s": evict_s, "evict_gbps": evict_gbps,
        "logits_bit_identical": all(r["logits_bit_identical"] for r in runs),
        "logits_max_abs_diff": max(r["logits_max_abs_diff"] for r in runs),
        "argmax_match": all(r["argmax_match"] for r in runs),
        "runs": runs,
        "model_build_s": build_s, "attach_s": attach_s,
        "max_gpu_memory_bytes": (torch.cuda.max_memory_allocated(device)
                                 if device.type == "cuda" else None),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "libkvtier": kvtier.library_path(),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.chunk % args.page:
        print(f"--chunk {args.chunk} is not a multiple of --page {args.page}",
              file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu --size tiny", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    if args.socket:
        with kvtier.Client(socket=args.socket, name="churn") as client:
            out = run(args, client)
    else:
        with kvtier.Daemon(root=args.daemon_dir) as daemon, kvtier.Client(socket=daemon.socket,
                                                      name="churn") as client:
            out = run(args, client)
    out["wall_s"] = time.perf_counter() - t0
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
