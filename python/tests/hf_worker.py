"""One process of the transformers proofs (test_hf_proof.py).

    hf_worker.py store     ARCH SOCKET OUT   # prefill PROMPT, store in kvtier, exit
    hf_worker.py resume    ARCH SOCKET OUT   # a new process: replay + continuation
    hf_worker.py reference ARCH -      OUT   # plain transformers, no kvtier

Each mode builds the same random-weight model (arch "llama" or "qwen3_next",
seed 0, bf16, CPU, one thread) and writes torch.save({name: {"stats": ...,
"logits": ...}}) to OUT. The chunk schedule is fixed: pages of PAGE tokens,
chunk boundaries at multiples of CHUNK.

Thread-safety: a single-threaded script.
"""

import dataclasses
import sys

import torch

torch.set_num_threads(1)  # the same arithmetic in every process

import kvtier  # noqa: E402
from kvtier import hf  # noqa: E402

PAGE = 8
CHUNK = 32
PROMPT = 200      # the first request: 25 pages, chunk boundaries 32..192, 200
CONTINUATION = 40  # the next turn's new tokens
REPLAY = 150      # a prompt ending inside the cached prefix
# Where the replay resumes: after the last cached full page before its last
# token (page 18: 144) for attention-only models; at the nearest snapshot at
# or before that (chunk boundary 128) for hybrid ones.
REPLAY_RESUME = {"llama": 144, "qwen3_next": 128}


def tokens():
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, 256, (PROMPT + CONTINUATION,), generator=g).tolist()
    return ids[:PROMPT], ids[PROMPT:]


def stats(r: hf.PrefillResult) -> dict:
    out = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)
           if f.name not in ("logits", "_rehydrate_timer")}
    out["commits"] = [dataclasses.asdict(c) for c in r.commits]
    return out


def engine(arch, client):
    model = hf.random_model(arch, "tiny", seed=0)
    return hf.PrefixCachingEngine(model, client, f"proof-{arch}", tokens_per_page=PAGE,
                                  chunk_tokens=CHUNK, pool_pages=64, snapshot_slots=2,
                                  page_rows=256, snapshot_rows=64)


def schedule(start, end):
    """The pieces a PrefixCachingEngine with CHUNK cuts [start, end) into."""
    cuts = list(range((start // CHUNK + 1) * CHUNK, end, CHUNK))
    points = [start, *cuts, end]
    return list(zip(points, points[1:]))


def run_pieces(model, ids, pieces, cache):
    return torch.cat([hf.forward(model, torch.tensor(ids[a:b]), cache, keep_all=True)
                      for a, b in pieces])


def main():
    mode, arch, socket, out_path = sys.argv[1:5]
    prompt, continuation = tokens()
    out = {}
    if mode == "store":
        with kvtier.Client(socket=socket, name="proof-store") as c:
            r = engine(arch, c).prefill(prompt, keep_all=True)
            out["store"] = {"stats": stats(r), "logits": r.logits}
    elif mode == "resume":
        with kvtier.Client(socket=socket, name="proof-resume") as c:
            e = engine(arch, c)
            r = e.prefill(prompt[:REPLAY], keep_all=True)
            out["replay"] = {"stats": stats(r), "logits": r.logits}
            e.clear_gpu_cache()  # the continuation, too, must come from kvtier
            r = e.prefill(prompt + continuation, keep_all=True)
            out["continuation"] = {"stats": stats(r), "logits": r.logits}
    elif mode == "reference":
        model = hf.random_model(arch, "tiny", seed=0)
        # Uninterrupted: the first request's schedule, then the next turn's,
        # on one cache in one process.
        cache = hf.new_cache(model)
        run_pieces(model, prompt, schedule(0, PROMPT), cache)
        logits = run_pieces(model, prompt + continuation,
                            schedule(PROMPT, PROMPT + CONTINUATION), cache)
        out["continuation"] = {"logits": logits}
        # The replay: the state at the resume point as the first request
        # computed it (its pieces up to the first boundary at or past the
        # resume point, cut back to it), then the rest of the replay prompt.
        resume = REPLAY_RESUME[arch]
        pieces = [p for p in schedule(0, PROMPT) if p[0] < resume]
        cache = hf.new_cache(model)
        run_pieces(model, prompt, pieces, cache)
        if pieces[-1][1] > resume:
            cache.crop(resume - pieces[-1][1])  # attention-only models
        logits = run_pieces(model, prompt, schedule(resume, REPLAY), cache)
        out["replay"] = {"logits": logits}
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    torch.save(out, out_path)


if __name__ == "__main__":
    main()
