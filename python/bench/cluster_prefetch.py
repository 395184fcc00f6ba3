#!/usr/bin/env python3
"""Prefetch throughput of kvtierd's cluster tier across a (virtual) wire
(issue 17), against redis-benchmark's GET throughput for values of the same
size from the same place. Prints one JSON object.

    sudo build/venv/bin/python python/bench/cluster_prefetch.py \\
        --out docs/data/cluster_prefetch-$(hostname)-$(date +%F).json
    ... --quick                  # a small run (CI smoke test)
    ... --page-bytes 262144      # a prefix that fits a small machine

Topology (python/tests/netns.py; root and iproute2 needed): three Redis
masters (no replicas) r0 r1 r2, node A's kvtierd and node B's kvtierd, each
in a network namespace of its own, joined by a bridge in a "switch"
namespace. The Redis servers run with MALLOC_CONF=--redis-malloc-conf
(default: jemalloc keeps freed pages, as docs/cluster.md advises). Steps:

  1. A (--cluster_write_through) commits a prefix of --tokens tokens, one
     page bank of --page-bytes per page of --tokens-per-page tokens
     (default Llama-8B-shaped: 16 tokens x 128 KiB of bf16 KV per token =
     2 MiB pages, 24,576 tokens = 1,536 pages = 3 GiB), and waits until
     its spill queue drained: `write` (seconds, GB/s; informative).
  2. For each --slice-pages value and --variant (extra daemon flags, e.g.
     --cluster_prefetch_in_flight), a fresh kvtierd on B
     (--cluster_prefetch_slice_pages): a remote lookup must see the whole
     prefix; then --repeats times: Prefetch, and poll B's lookups (5 ms
     apart) until the whole prefix is local: seconds from the Prefetch call,
     GB/s of page bytes and of value bytes (header and MAC included), and
     from B's metrics the seconds its Fetch calls took (sending the GETs,
     reading the replies, copying them out); the rest is verifying values
     (HMAC-SHA256), copying them into the banks and committing (the job's
     seconds per stage, from B's metrics: `job_stage_seconds`); and the
     CPU-seconds of B's kvtierd (exited threads included), of the Redis
     servers and of the whole machine (busy, softirq, idle). The
     first run fills fresh bank pages (page faults), so the JSON keeps
     `first` apart from the `warm` runs (the prefix dropped between runs,
     the banks kept). B's bytes are checked: every page's first 8 bytes, and
     3 pages whole. With --perf, one more prefetch (not in the figures)
     runs under `perf record` (call graphs) of B's kvtierd (of every CPU
     with --perf-system; python/bench/perf_shares.py): the shares of
     its samples spent in the fetch, the socket reads, the reply copies,
     the MAC checks, page faults... go to the JSON (`profiled_run`).
  3. redis-benchmark (redis-tools), run in B's namespace against the
     masters in --cluster mode: SET then GET of values of one page's value
     size, with the parallelism of the daemon's fetches matched: a
     connection per master for each slice in flight
     (--cluster_prefetch_in_flight of the first variant, default 4: -c 12;
     redis-benchmark spreads its clients over the masters) and a pipeline
     of ceil(slice_pages / 3) GETs (-P), as a slice's GETs are grouped per
     master and pipelined on one connection each; the GET run --rb-repeats
     times, the median kept. The
     ratio prefetch / redis-benchmark is of values per second, median to
     median (and best to median; the issue's target: >= 0.8).
  4. Single-core reference rates on this machine: HMAC-SHA256 and memcpy of
     one value (Python's hashlib/ctypes, i.e. OpenSSL and libc).

Timing is wall-clock here, never asserted. Thread-safety: a
single-threaded script.
"""

import argparse
import contextlib
import ctypes
import hashlib
import hmac
import json
import math
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import kvtier  # noqa: E402

import cluster_values as cv  # noqa: E402
from netns import Topology, netns_unavailable  # noqa: E402
from netns_redis import (NetnsRedisCluster, find_tool, key_file,  # noqa: E402
                         netns_daemon)
from host_cpu import (children_cpu, cpu_split, cpu_times,  # noqa: E402
                      process_cpu, stat_fields, steal_percent, thread_cpu)
from perf_shares import perf_record, perf_shares  # noqa: E402

MASTERS = ["r0", "r1", "r2"]
# What docs/cluster.md advises for the Redis servers of a cluster tier:
# jemalloc keeps the pages of freed reply buffers instead of handing them back
# to the kernel, which refaults them on the next burst of GETs.
REDIS_MALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
NAME = "bench-prefix"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=24576)
    ap.add_argument("--tokens-per-page", type=int, default=16)
    ap.add_argument("--page-bytes", type=int, default=2 << 20,
                    help="bytes of KV per page (one bank row)")
    ap.add_argument("--quick", action="store_true",
                    help="2,048 tokens of 64 KiB pages, 1 repeat (smoke run)")
    ap.add_argument("--slice-pages", default="32",
                    help="comma list of --cluster_prefetch_slice_pages to run")
    ap.add_argument("--prefetch-threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5, help="prefetches per slice size")
    ap.add_argument("--redis-maxmemory", type=int, default=0,
                    help="bytes per master (0: the prefix's share x 1.5 plus "
                         "redis-benchmark's keys plus 256 MiB)")
    ap.add_argument("--rb-keys", type=int, default=0,
                    help="redis-benchmark's keys per master (0: as many as "
                         "fit in 512 MiB, 16..256)")
    ap.add_argument("--rb-seconds", type=float, default=3.0,
                    help="about how long redis-benchmark's GET runs")
    ap.add_argument("--rb-repeats", type=int, default=3,
                    help="redis-benchmark GET runs (the median is used)")
    ap.add_argument("--variant", action="append", default=[],
                    metavar="NAME=FLAGS",
                    help="B's kvtierd with these extra flags (space-separated), "
                         "run for each slice size; repeatable (default: one "
                         "variant 'default' with none)")
    ap.add_argument("--redis-malloc-conf", default=REDIS_MALLOC_CONF,
                    help="MALLOC_CONF of the Redis servers (jemalloc options; "
                         "default: freed reply buffers kept rather than "
                         "returned to the kernel, as docs/cluster.md advises; "
                         "'' for jemalloc's own defaults)")
    ap.add_argument("--perf", action="store_true",
                    help="perf record B's kvtierd (call graphs) during one more "
                         "prefetch of each slice size and variant")
    ap.add_argument("--perf-system", action="store_true",
                    help="with --perf: record every CPU (Redis, softirq) instead")
    ap.add_argument("--kvtierd", default=None)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.page_bytes, args.repeats = 2048, 64 << 10, 1
    args.slices = [int(s) for s in args.slice_pages.split(",") if s]
    args.variants = []
    for v in args.variant or ["default="]:
        name, sep, flags = v.partition("=")
        if not sep or not name:
            ap.error(f"--variant {v!r}: NAME=FLAGS expected")
        args.variants.append((name, flags.split()))
    return args


# -- the machine -------------------------------------------------------------------

def machine() -> dict:
    mem = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            mem[k] = int(v.split()[0]) * 1024
    cpu = ""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and not cpu:
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    redis = subprocess.run([find_tool("redis-server"), "--version"],
                           capture_output=True, text=True).stdout.strip()
    return {"host": socket.gethostname(), "nproc": os.cpu_count(),
            "mem_total_bytes": mem.get("MemTotal"), "cpu": cpu,
            "sha_ni": "sha_ni" in flags, "kernel": platform.release(),
            "redis": redis.split(" sha=")[0]}


def reference_rates(value_bytes: int) -> dict:
    """One core: HMAC-SHA256 and memcpy of values, GB/s, over 512 MiB of
    distinct values (as a prefetch sees them: not in any cache)."""
    n = max(4, (512 << 20) // value_bytes)
    src = ctypes.create_string_buffer(n * value_bytes)
    dst = ctypes.create_string_buffer(n * value_bytes)
    ctypes.memset(src, 7, n * value_bytes)
    ctypes.memset(dst, 1, n * value_bytes)  # both faulted in before timing
    view = memoryview(src)
    key = os.urandom(32)
    t0 = time.perf_counter()
    for i in range(n):
        hmac.new(key, view[i * value_bytes:(i + 1) * value_bytes], hashlib.sha256).digest()
    hmac_s = time.perf_counter() - t0
    base_s, base_d = ctypes.addressof(src), ctypes.addressof(dst)
    t0 = time.perf_counter()
    for i in range(n):
        ctypes.memmove(base_d + i * value_bytes, base_s + i * value_bytes, value_bytes)
    copy_s = time.perf_counter() - t0
    return {"hmac_sha256_gbps_one_core": round(n * value_bytes / hmac_s / 1e9, 3),
            "memcpy_gbps_one_core": round(n * value_bytes / copy_s / 1e9, 3),
            "over_bytes": n * value_bytes}


# -- daemons' numbers ----------------------------------------------------------------

def ctl() -> str:
    return os.environ.get("KVTIERCTL") or os.path.join(
        os.path.dirname(os.path.realpath(kvtier.find_kvtierd())), "..", "cli",
        "kvtierctl")


def cluster_status(daemon) -> dict:
    out = subprocess.run([ctl(), f"--socket={daemon.socket}", "--json", "status"],
                         check=True, capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout).get("cluster", {})


def metrics(topo, host: str) -> dict:
    """B's kvtier_cluster_* samples, {"name{labels}": value}."""
    text = topo.run(host, [sys.executable, "-c",
                           "import urllib.request, sys; sys.stdout.write("
                           "urllib.request.urlopen('http://127.0.0.1:9464/metrics',"
                           " timeout=30).read().decode())"]).stdout
    out = {}
    for line in text.splitlines():
        if line.startswith("kvtier_cluster_"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v)
    return out


def redis_usage(redis) -> tuple[float, int]:
    """CPU-seconds and minor page faults of the Redis masters so far."""
    pids = [redis.procs[h].pid for h in MASTERS]
    return sum(process_cpu(p) for p in pids), sum(int(stat_fields(p)[7]) for p in pids)


def delta(after: dict, before: dict) -> dict:
    return {k: round(v - before.get(k, 0.0), 3) for k, v in after.items()
            if v - before.get(k, 0.0) > 0.005}


# -- A writes, B prefetches ------------------------------------------------------------

def fill(ns, hashes, page_bytes: int, base: bytes, chunk: int = 64) -> None:
    """Commits every page of `hashes`; page p holds `base` with p in its
    first 8 bytes."""
    for first in range(0, len(hashes), chunk):
        n = min(chunk, len(hashes) - first)
        res = ns.reserve(n)
        (bank,) = ns.page_banks
        for i, row in enumerate(res.page_rows):
            addr = bank.row_address(row)
            ctypes.memmove(addr, base, page_bytes)
            ctypes.memmove(addr, (first + i).to_bytes(8, "little"), 8)
        res.commit(hashes[first:first + n],
                   parent=hashes[first - 1] if first else None)


def check_pages(ns, hashes, page_bytes: int, base: bytes) -> None:
    with ns.lookup(hashes, pin=True) as lease:
        if lease.matched_pages != len(hashes):
            raise RuntimeError(f"B holds {lease.matched_pages} of {len(hashes)} pages")
        (bank,) = ns.page_banks
        for p, row in enumerate(lease.rows):
            if ctypes.string_at(bank.row_address(row), 8) != p.to_bytes(8, "little"):
                raise RuntimeError(f"page {p}: wrong bytes on B")
        for p in (0, len(hashes) // 2, len(hashes) - 1):
            want = p.to_bytes(8, "little") + base[8:]
            if bank.read_row(lease.rows[p]) != want:
                raise RuntimeError(f"page {p}: wrong bytes on B")


def prefetch_once(topo, b, nb, hashes, perf_out: str | None, redis,
                  perf_system: bool = False) -> dict:
    pages = len(hashes)
    m0, cpu0 = metrics(topo, "b"), thread_cpu(b.proc.pid)
    p0, (r0, f0) = process_cpu(b.proc.pid), redis_usage(redis)
    perf = None
    if perf_out:
        perf = perf_record(None if perf_system else b.proc.pid, perf_out)
        time.sleep(0.5)
    polls = 0
    t0, mach0 = time.perf_counter(), cpu_times()
    res = nb.prefetch(hashes)
    while True:
        with nb.lookup(hashes, pin=False) as lease:
            matched = lease.matched_pages
        polls += 1
        if matched >= pages:
            break
        if polls % 50 == 0:
            with nb.lookup(hashes, pin=False, remote=True) as lease:
                if lease.prefetching_pages == 0 and lease.matched_pages < pages:
                    raise RuntimeError(f"the prefetch stopped at {lease.matched_pages} "
                                       f"of {pages} pages (B's log: {b.log()[-1500:]})")
        time.sleep(0.005)
    seconds = time.perf_counter() - t0
    mach = cpu_split(mach0, cpu_times())
    p1, (r1, f1) = process_cpu(b.proc.pid), redis_usage(redis)
    if perf is not None:
        perf.send_signal(2)
        perf.wait(timeout=120)
    m1, cpu1 = metrics(topo, "b"), thread_cpu(b.proc.pid)
    fetch_s = m1.get('kvtier_cluster_op_seconds_total{op="fetch"}', 0) - \
        m0.get('kvtier_cluster_op_seconds_total{op="fetch"}', 0)
    fetches = m1.get('kvtier_cluster_ops_total{op="fetch"}', 0) - \
        m0.get('kvtier_cluster_ops_total{op="fetch"}', 0)
    fetched = m1.get('kvtier_cluster_bytes_total{direction="in"}', 0) - \
        m0.get('kvtier_cluster_bytes_total{direction="in"}', 0)
    stage = 'kvtier_cluster_prefetch_stage_seconds_total{stage="%s"}'
    stages = {st: round(m1.get(stage % st, 0) - m0.get(stage % st, 0), 4)
              for st in ("wait", "check", "commit")}
    return {"seconds": round(seconds, 4), "prefetch_answer": [res.local_pages,
            res.remote_pages, res.prefetching_pages],
            "fetch_calls": int(fetches), "fetch_seconds": round(fetch_s, 4),
            "fetched_bytes": int(fetched),
            "verify_copy_commit_seconds": round(seconds - fetch_s, 4),
            "job_stage_seconds": stages,
            "daemon_thread_cpu_seconds": delta(cpu1, cpu0), "lookup_polls": polls,
            "cpu_seconds": {"kvtierd_b": round(p1 - p0, 2),
                            "redis": round(r1 - r0, 2), "machine": mach},
            "redis_page_faults": f1 - f0}


def run_slice(args, topo, redis, work, common, hashes, base, value_bytes, slice_pages,
              variant):
    flags = common + [f"--cluster_prefetch_slice_pages={slice_pages}",
                      f"--cluster_prefetch_threads={args.prefetch_threads}"] + variant[1]
    pages, page_bytes = len(hashes), args.page_bytes
    runs = []
    with netns_daemon(topo, "b", work, flags, kvtierd=args.kvtierd) as b, \
            kvtier.Client(socket=b.socket, name="bench-b", timeout_ms=60000) as cb:
        nb = cb.attach(NAME, layout(args), page_rows=pages + 16)
        seen = 0
        for _ in range(200):
            with nb.lookup(hashes, pin=False, remote=True) as lease:
                seen = lease.remote_pages
            if seen == pages:
                break
            time.sleep(0.05)
        if seen != pages:
            raise RuntimeError(f"B's remote lookup sees {seen} of {pages} pages")
        redis_cpu0 = {h: process_cpu(redis.procs[h].pid) for h in MASTERS}
        profiled = None
        for r in range(args.repeats + int(args.perf)):
            if r:
                cb.drop(NAME, hash=hashes[0])  # the rows go, the banks stay
            perf_out = os.path.join(work, f"perf-{slice_pages}-{variant[0]}.data") \
                if r == args.repeats else None
            run = prefetch_once(topo, b, nb, hashes, perf_out, redis, args.perf_system)
            check_pages(nb, hashes, page_bytes, base)
            run["page_gbps"] = round(pages * page_bytes / run["seconds"] / 1e9, 3)
            run["value_gbps"] = round(pages * value_bytes / run["seconds"] / 1e9, 3)
            run["values_per_s"] = round(pages / run["seconds"], 1)
            if perf_out:
                run["perf"] = perf_shares(perf_out)
                profiled = run
            else:
                runs.append(run)
        redis_cpu = {h: round(process_cpu(redis.procs[h].pid) - redis_cpu0[h], 3)
                     for h in MASTERS}
        status = cluster_status(b)
    warm = runs[1:] or runs
    best = min(warm, key=lambda r: r["seconds"])
    median_s = statistics.median(r["seconds"] for r in warm)
    return {"slice_pages": slice_pages, "variant": variant[0],
            "daemon_flags": variant[1],
            # The daemon's slices also hold at most 64 MiB of values.
            "effective_slice_pages": effective_slice(slice_pages, value_bytes),
            "first": runs[0], "warm": runs[1:],
            "profiled_run": profiled,
            "median_warm_seconds": round(median_s, 4),
            "median_warm_values_per_s": round(pages / median_s, 1),
            "median_warm_value_gbps": round(pages * value_bytes / median_s / 1e9, 3),
            "median_warm_page_gbps": round(pages * page_bytes / median_s / 1e9, 3),
            "best_warm_values_per_s": best["values_per_s"],
            "best_warm_value_gbps": best["value_gbps"],
            "redis_cpu_seconds_all_runs": redis_cpu,
            "b_status": {k: status.get(k) for k in (
                "fetched_values", "rejected_values", "prefetches",
                "prefetched_pages", "prefetches_cut")}}


def effective_slice(slice_pages: int, value_bytes: int) -> int:
    return max(1, min(slice_pages, (64 << 20) // value_bytes))


def layout(args) -> kvtier.Layout:
    return kvtier.Layout(tokens_per_page=args.tokens_per_page, num_layers=32,
                         page_banks=(kvtier.BankLayout("kv", args.page_bytes,
                                                       "bfloat16"),),
                         model="bench-llama-8b")


# -- redis-benchmark -------------------------------------------------------------------

def in_flight_of(flags) -> int:
    """The daemon's slices in flight under `flags` (its default: 4, as
    daemon/cluster_tier.h sets it)."""
    for f in flags:
        m = re.fullmatch(r"--cluster_prefetch_in_flight=(\d+)", f)
        if m:
            return int(m.group(1))
    return 4


def redis_benchmark(args, topo, redis, value_bytes: int, slice_pages: int,
                    in_flight: int) -> dict:
    rb = find_tool("redis-benchmark")
    keys = args.rb_keys or max(16, min(256, (512 << 20) // value_bytes))
    pipeline = math.ceil(effective_slice(slice_pages, value_bytes) / len(MASTERS))
    clients = len(MASTERS) * in_flight
    base = [rb, "-h", topo.addr(MASTERS[0]), "-p", "6379", "-a",
            redis.admin_password, "--cluster", "-c", str(clients), "-P",
            str(pipeline), "-d", str(value_bytes), "-r", str(keys), "--csv"]
    # Every key of the keyspace written (8 SETs per key: all but ~0.03 %).
    n_set = 8 * keys * len(MASTERS)
    before = {h: int(redis.command(h, "dbsize").strip()) for h in MASTERS}
    set_out = topo.run("b", base + ["-t", "set", "-n", str(n_set)], timeout=600).stdout
    per_master = {h: int(redis.command(h, "dbsize").strip()) - before[h]
                  for h in MASTERS}
    # A first GET run sizes the measured one to about --rb-seconds.
    probe = parse_rps(topo.run("b", base + ["-t", "get", "-n", str(
        len(MASTERS) * pipeline * 20)], timeout=600).stdout, "GET")
    n_get = max(len(MASTERS) * pipeline * 20, int(probe * args.rb_seconds))
    runs, cpu = [], []
    for _ in range(args.rb_repeats):
        c0, m0, t0 = children_cpu(), cpu_times(), time.perf_counter()
        r0, f0 = redis_usage(redis)
        runs.append(parse_rps(topo.run("b", base + ["-t", "get", "-n", str(n_get)],
                                       timeout=600).stdout, "GET"))
        r1, f1 = redis_usage(redis)
        cpu.append({"seconds": round(time.perf_counter() - t0, 3),
                    "redis_benchmark": round(children_cpu() - c0, 2),
                    "redis": round(r1 - r0, 2), "machine": cpu_split(m0, cpu_times()),
                    "redis_page_faults": f1 - f0})
    rps = statistics.median(runs)
    return {"command": " ".join(["redis-benchmark", "-h", topo.addr(MASTERS[0]),
                                 "--cluster", "-c", str(clients), "-P", str(pipeline), "-d",
                                 str(value_bytes), "-r", str(keys), "-t", "get",
                                 "-n", str(n_get)]),
            "matched": (f"the daemon's fetches of {in_flight} "
                        f"{effective_slice(slice_pages, value_bytes)}-page slices "
                        f"in flight: {in_flight} connection(s) per master (-c "
                        f"{clients}, spread over the masters in --cluster mode), "
                        f"{pipeline} pipelined GETs each (-P), values of one "
                        f"page's value size (-d)"),
            "clients": clients,
            "keys_per_master": keys, "keys_written_per_master": per_master,
            "set_rps": parse_rps(set_out, "SET"), "get_rps_runs": runs,
            "get_cpu_seconds_runs": cpu,
            "get_rps": rps,
            "get_value_gbps": round(rps * value_bytes / 1e9, 3)}


def parse_rps(out: str, test: str) -> float:
    for line in out.splitlines():
        if line.startswith(f'"{test}"'):
            return float(line.split(",")[1].strip('"'))
    raise RuntimeError(f"redis-benchmark printed no {test} line:\n{out[-2000:]}")


# -- main ------------------------------------------------------------------------------

def main(argv=None) -> int:
    args = parse_args(argv)
    why = netns_unavailable()
    if why:
        sys.exit(f"cluster_prefetch: {why}")
    tpp, page_bytes = args.tokens_per_page, args.page_bytes
    pages = args.tokens // tpp
    value_bytes = cv.header_bytes(1) + page_bytes + 32
    total_values = pages * value_bytes
    rb_keys = args.rb_keys or max(16, min(256, (512 << 20) // value_bytes))
    maxmemory = args.redis_maxmemory or int(
        total_values / len(MASTERS) * 1.5 + rb_keys * value_bytes * 1.2 + (256 << 20))
    result = {"benchmark": "cluster_prefetch", "machine": machine(),
              "config": {"tokens": args.tokens, "tokens_per_page": tpp,
                         "page_bytes": page_bytes, "pages": pages,
                         "prefix_bytes": pages * page_bytes,
                         "value_bytes": value_bytes, "banks": 1,
                         "prefetch_threads": args.prefetch_threads,
                         "slice_pages": args.slices, "repeats": args.repeats,
                         "variants": {n: f for n, f in args.variants},
                         "redis_masters": len(MASTERS), "redis_replicas": 0,
                         "redis_maxmemory_bytes": maxmemory, "quick": args.quick,
                         "redis_malloc_conf": args.redis_malloc_conf,
                         "topology": "one network namespace per Redis master and "
                                     "per kvtierd, veths on a bridge in a switch "
                                     "namespace"}}
    cpu0 = cpu_times()
    work = tempfile.mkdtemp(prefix="kvtier-bench-netns-")
    try:
        with contextlib.ExitStack() as stack:
            topo = stack.enter_context(Topology(MASTERS + ["a", "b"]))
            redis = stack.enter_context(NetnsRedisCluster(
                topo, MASTERS, maxmemory=str(maxmemory),
                env={"MALLOC_CONF": args.redis_malloc_conf}
                if args.redis_malloc_conf else None))
            key = key_file(os.path.join(work, "cluster.key"))
            common = [f"--cluster_redis={redis.seeds}", f"--cluster_key_file={key}",
                      f"--cluster_user={redis.user}",
                      f"--cluster_password_file={redis.password_file(work + '/pw')}"]
            a = stack.enter_context(netns_daemon(topo, "a", work, common + [
                "--cluster_write_through",
                f"--cluster_spill_queue_bytes={total_values + (256 << 20)}"],
                kvtierd=args.kvtierd))
            ca = stack.enter_context(kvtier.Client(socket=a.socket, name="bench-a",
                                                   timeout_ms=60000))
            na = ca.attach(NAME, layout(args), page_rows=pages + 16)
            hashes = na.hash_tokens(list(range(pages * tpp)))
            base = os.urandom(page_bytes)
            t0 = time.perf_counter()
            fill(na, hashes, page_bytes, base)
            for _ in range(100000):
                st = cluster_status(a)
                if int(st.get("spilled_values", 0)) + int(st.get("spills_dropped", 0)) \
                        + int(st.get("spills_failed", 0)) >= pages and \
                        int(st.get("spill_queue_bytes", 0)) == 0:
                    break
                time.sleep(0.01)
            write_s = time.perf_counter() - t0
            result["write"] = {"seconds": round(write_s, 3),
                               "value_gbps": round(total_values / write_s / 1e9, 3),
                               "spilled_values": int(st.get("spilled_values", 0)),
                               "spills_dropped": int(st.get("spills_dropped", 0)),
                               "spills_failed": int(st.get("spills_failed", 0))}
            if result["write"]["spilled_values"] < pages:
                raise RuntimeError(f"A wrote {result['write']} of {pages} pages")
            result["prefetch"] = [run_slice(args, topo, redis, work, common, hashes,
                                            base, value_bytes, s, v)
                                  for s in args.slices for v in args.variants]
            default = next((p for p in result["prefetch"] if p["slice_pages"] == 32
                            and p["variant"] == args.variants[0][0]),
                           result["prefetch"][0])
            result["redis_benchmark"] = redis_benchmark(
                args, topo, redis, value_bytes, default["slice_pages"],
                in_flight_of(default["daemon_flags"]))
            result["reference"] = reference_rates(value_bytes)
            rb = result["redis_benchmark"]["get_rps"]
            result["ratio"] = {
                "slice_pages": default["slice_pages"],
                "prefetch_values_per_s_median": default["median_warm_values_per_s"],
                "prefetch_values_per_s_best": default["best_warm_values_per_s"],
                "redis_benchmark_get_per_s": rb,
                "prefetch_over_redis_benchmark_median": round(
                    default["median_warm_values_per_s"] / rb, 3),
                "prefetch_over_redis_benchmark_best": round(
                    default["best_warm_values_per_s"] / rb, 3),
                "variant": default["variant"],
                "median_by_variant": {
                    f'{p["variant"]}/{p["slice_pages"]}': round(
                        p["median_warm_values_per_s"] / rb, 3)
                    for p in result["prefetch"]},
                "target": 0.8}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["machine"]["cpu_steal_percent_during_run"] = steal_percent(cpu0, cpu_times())
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
