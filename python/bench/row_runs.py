#!/usr/bin/env python3
"""How consecutive are the host rows kvtierd hands to a reservation once its
bank has churned? (Issue 16: the copy engine moves an eviction of 256 KiB
block-first pages at 85 % of the link beside a decode step when the host rows
are random, and at 92-94 % when they come in runs of 8-64 consecutive rows;
transfer_bench --row_run.) Prints one JSON object.

    build/venv/bin/python python/bench/row_runs.py --out docs/data/row_runs-$(hostname)-$(date +%F).json

An agent-like workload against a private kvtierd (no GPU; rows of 4 KiB
stand for pages): --conversations conversations, each turn of one (chosen
uniformly) looks its prefix up, then reserves and commits the turn's new
pages below it (a conversation past an eighth of the bank ends and a new
one takes its place); between turns, auxiliary requests commit fresh prefixes
that nothing asks for again. The bank (--rows rows) fills within the first
turns and every later reservation evicts least recently used pages, as the
daemon does. After --warm reservations, each reservation's rows (in the
order the daemon returned them, which is the order the engine's pages are
copied in) are cut into runs of consecutive ascending rows; the JSON gives
the share of pages in runs of at least 2, 8, 64 rows, and the page-weighted
median run. --lengths-out writes the run lengths seen as "length count"
lines, which transfer_bench --row_run_lengths draws host rows by.

Thread-safety: a single-threaded script.
"""

import argparse
import collections
import json
import os
import random
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import kvtier  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8192, help="bank rows (pages)")
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turn-pages", default="4,64",
                    help="min,max new pages per conversation turn")
    ap.add_argument("--aux-pages", default="16,256",
                    help="min,max pages of an auxiliary request")
    ap.add_argument("--aux-per-turn", type=int, default=2)
    ap.add_argument("--reservations", type=int, default=3000,
                    help="reservations measured after --warm")
    ap.add_argument("--warm", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kvtierd", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--lengths-out", default=None,
                    help='write the run lengths as "length count" lines '
                         "(for transfer_bench --row_run_lengths)")
    return ap.parse_args(argv)


def runs_of(rows: list[int]) -> list[int]:
    """Lengths of the maximal runs of consecutive ascending rows."""
    out, n = [], 0
    for i, r in enumerate(rows):
        n = n + 1 if i and r == rows[i - 1] + 1 else 1
        if i + 1 == len(rows) or rows[i + 1] != r + 1:
            out.append(n)
    return out


def pick(rng: random.Random, spec: str) -> int:
    lo, hi = (int(x) for x in spec.split(","))
    return rng.randint(lo, hi)


def main(argv=None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    layout = kvtier.Layout(tokens_per_page=16, num_layers=1,
                           page_banks=(kvtier.BankLayout("kv", 4096, "bfloat16"),),
                           model="row-runs")
    runs: list[int] = []
    reservations = 0
    with kvtier.Daemon(kvtierd=args.kvtierd).start() as d, \
            kvtier.Client(socket=d.socket, name="row-runs") as c:
        ns = c.attach("row-runs", layout, page_rows=args.rows)
        convs = [[] for _ in range(args.conversations)]  # token lists
        next_token = 1

        def fresh(pages: int) -> list[int]:
            nonlocal next_token
            toks = list(range(next_token, next_token + pages * 16))
            next_token += pages * 16
            return toks

        def store(tokens: list[int]) -> None:
            nonlocal reservations
            hashes = ns.hash_tokens(tokens)
            with ns.lookup(hashes, pin=False) as lease:
                have = lease.matched_pages
            if have == len(hashes):
                return
            res = ns.reserve(len(hashes) - have)
            rows = list(res.page_rows)
            res.commit(hashes[have:], parent=hashes[have - 1] if have else None)
            reservations += 1
            if reservations > args.warm:
                runs.extend(runs_of(rows))

        while reservations < args.warm + args.reservations:
            i = rng.randrange(len(convs))
            if len(convs[i]) // 16 > args.rows // 8:
                convs[i] = []  # That conversation ended; a new one starts.
            convs[i] += fresh(pick(rng, args.turn_pages))
            store(convs[i])
            for _ in range(args.aux_per_turn):
                store(fresh(pick(rng, args.aux_pages)))
    pages = sum(runs)
    weighted = sorted(r for r in runs for _ in range(r))
    result = {
        "benchmark": "row_runs",
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "kvtierd")},
        "pages": pages,
        "runs": len(runs),
        "mean_run": round(pages / max(1, len(runs)), 2),
        "page_weighted_median_run": statistics.median(weighted) if weighted else 0,
        "share_of_pages_in_runs": {
            f">={k}": round(sum(r for r in runs if r >= k) / max(1, pages), 3)
            for k in (2, 4, 8, 16, 64)},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.lengths_out:
        with open(args.lengths_out, "w") as f:
            for length, count in sorted(collections.Counter(runs).items()):
                f.write(f"{length} {count}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
