"""GB/s of the vLLM connector's worker half on a GPU, against a contiguous
copy of the same bytes in the same run. Prints JSON.

The buffer is laid out as vLLM >= 0.32 lays its KV cache (one backing
allocation; block-first BLHNC, which the connector asks for on GPUs, or
layer-first LBHNC, vLLM's default); a store is the connector's whole path
for one request (Reserve, the copies on the current stream, commit once the
stream is done), a load the copies of pinned rows back into other blocks.

    python3 python/bench/vllm_worker_bench.py --out worker.json
"""

import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import kvtier  # noqa: E402
from kvtier.vllm.config import ConnectorConfig  # noqa: E402
from kvtier.vllm.layout import (CacheDescription, Group, NamespaceIdentity,  # noqa: E402
                                Placement, namespace_layout)
from kvtier.vllm.scheduler import KvtierScheduler  # noqa: E402
from kvtier.vllm.worker import KvtierWorker  # noqa: E402


class Req:
    def __init__(self, rid, hashes, tokens):
        self.request_id, self.block_hashes, self.num_tokens = rid, hashes, tokens
        self.all_token_ids = []


def cache_for(layout, num_blocks, layers, page, bs):
    names = tuple(f"l{i}" for i in range(layers))
    if layout == "block_first":
        p = Placement(names, page, page * layers, page)
    else:
        p = Placement(names, page * num_blocks, page, page)
    return CacheDescription(num_blocks, (p,), (Group("attention", bs, names),), bs,
                            "bfloat16")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-blocks", type=int, default=4096)
    ap.add_argument("--blocks", type=int, default=512, help="blocks per request")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    page = 2 * args.block_size * args.kv_heads * args.head_dim * 2
    row = page * args.layers
    results = {"machine": torch.cuda.get_device_name(0), "row_bytes": row,
               "blocks": args.blocks, "layouts": {}}
    host_rows = 3 * args.blocks
    ident = NamespaceIdentity("bench", "", "0" * 64, "bfloat16", "auto",
                              args.block_size, 1, 0, "sha256")
    with kvtier.Daemon(flags=[f"--default_namespace_bytes={host_rows * row}"]) as d:
        cfg = ConnectorConfig.parse({"socket": d.socket})
        for layout_name in ("block_first", "layer_first"):
            cache = cache_for(layout_name, args.gpu_blocks, args.layers, page,
                              args.block_size)
            layout = namespace_layout(cache, ident, 32)
            name = f"bench-{layout_name}"
            sched = KvtierScheduler(cfg, name, layout, cache)
            worker = KvtierWorker(cfg, name, layout, cache)
            # Block 0 is vLLM's null block: never a request's, never stored.
            buf = torch.randint(0, 256, (args.gpu_blocks * row,), dtype=torch.uint8,
                                device="cuda")
            worker.register(buf)
            stores, loads = [], []
            for rep in range(args.repeats):
                blocks = random.Random(rep).sample(range(1, args.gpu_blocks), args.blocks)
                hashes = [os.urandom(32) for _ in blocks]
                req = Req(f"r{rep}", hashes, (args.blocks + 1) * args.block_size)
                sched.matched_tokens(req, 0)
                job = sched.plan_store(req.request_id, args.blocks * args.block_size,
                                       (blocks,))
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                worker.store([job])
                report = worker.flush()
                stores.append(time.perf_counter() - t0)
                assert report.stored, report
                sched.on_report(report)
                req2 = Req(f"l{rep}", hashes, req.num_tokens)
                assert sched.matched_tokens(req2, 0) == args.blocks * args.block_size
                dst = random.Random(100 + rep).sample(range(1, args.gpu_blocks), args.blocks)
                sched.after_alloc(req2, (dst,), args.blocks * args.block_size)
                jobs = sched.take_loads()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                worker.load(jobs)
                torch.cuda.synchronize()
                loads.append(time.perf_counter() - t0)
                sched.on_report(worker.poll())
                sched.finished(req.request_id)
                sched.finished(req2.request_id)
            nbytes = args.blocks * row
            results["layouts"][layout_name] = {
                "store_gbps_p50": nbytes / statistics.median(stores) / 1e9,
                "load_gbps_p50": nbytes / statistics.median(loads) / 1e9,
                "store_ms_p50": 1e3 * statistics.median(stores),
                "load_ms_p50": 1e3 * statistics.median(loads),
                "regions_per_block": len(cache.regions())}
            worker.close()
            sched.close()
            del buf
        # The ceiling: one contiguous copy of the same bytes each way.
        src = torch.empty(args.blocks * row, dtype=torch.uint8, device="cuda")
        host = torch.empty(args.blocks * row, dtype=torch.uint8, pin_memory=True)
        outs, ins = [], []
        for _ in range(args.repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            host.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            outs.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            src.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            ins.append(time.perf_counter() - t0)
        results["contiguous_d2h_gbps_p50"] = args.blocks * row / statistics.median(outs) / 1e9
        results["contiguous_h2d_gbps_p50"] = args.blocks * row / statistics.median(ins) / 1e9
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
