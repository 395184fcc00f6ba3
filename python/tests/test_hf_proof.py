"""The CPU proofs of the transformers integration (issue 7), for an
attention-only model (Llama architecture) and a hybrid Gated DeltaNet model
(Qwen3-Next architecture), both tiny with seeded random weights:

1. A process prefills a prompt in chunks, storing KV pages and (hybrid) a
   recurrent-state snapshot at every chunk boundary into kvtier, and exits.
2. A new process sends the prompt plus the next turn: it rehydrates the whole
   prompt from kvtier and computes only the new tokens, and those logits are
   bit-identical to an uninterrupted run with the same chunk schedule.
3. The same new process replays a prompt that ends inside the cached prefix:
   it resumes from the nearest usable point (the last cached page for Llama,
   the nearest snapshot for Qwen3-Next) and recomputes only the rest, again
   bit-identical to the uninterrupted computation.
"""

import os
import subprocess
import sys

import pytest
import torch

from conftest import child_env

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_worker as w  # noqa: E402


def spawn(mode, arch, socket, out):
    return subprocess.Popen([sys.executable, os.path.join(HERE, "hf_worker.py"), mode,
                             arch, socket, str(out)], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc):
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output


@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
def test_new_process_resumes_bit_identical(arch, daemon, tmp_path):
    hybrid = arch == "qwen3_next"
    store, resume, ref = (tmp_path / f"{n}.pt" for n in ("store", "resume", "ref"))
    # The reference needs no daemon: run it beside the first process.
    ref_proc = spawn("reference", arch, "-", ref)
    finish(spawn("store", arch, daemon.socket, store))
    finish(spawn("resume", arch, daemon.socket, resume))  # after "store" exited
    finish(ref_proc)
    stored = torch.load(store)["store"]["stats"]
    got, want = torch.load(resume), torch.load(ref)

    # 1. Everything was stored: 25 pages, a snapshot at each page-aligned
    # chunk boundary (32, 64, ..., 192 and the prompt's end, 200).
    pages = w.PROMPT // w.PAGE
    assert stored["computed_tokens"] == w.PROMPT and stored["commit_errors"] == []
    assert sum(c["committed_pages"] for c in stored["commits"]) == pages
    assert stored["stored_snapshots"] == (7 if hybrid else 0)
    assert sum(c["committed_snapshots"] for c in stored["commits"]) == (7 if hybrid else 0)

    # 2. The next turn rehydrates the prompt and computes only the new tokens.
    cont = got["continuation"]["stats"]
    assert cont["tier_matched_pages"] == pages and cont["tier_usable_pages"] == pages
    assert cont["resume_tokens"] == w.PROMPT
    assert cont["tier_hit_tokens"] == w.PROMPT and cont["gpu_hit_tokens"] == 0
    assert cont["snapshot_from_tier"] == hybrid
    assert cont["computed_tokens"] == w.CONTINUATION
    assert cont["pieces"] == [(200, 224), (224, 240)]
    a, b = got["continuation"]["logits"], want["continuation"]["logits"]
    assert a.shape == (w.CONTINUATION, 256)
    assert torch.equal(a, b), f"max |diff| {(a.float() - b.float()).abs().max()}"

    # 3. The replay of a prompt ending inside the cached prefix: 18 full pages
    # before its last token are cached; a hybrid model can resume only where
    # a snapshot is (page 16, token 128).
    rep = got["replay"]["stats"]
    resume_at = w.REPLAY_RESUME[arch]
    assert rep["tier_matched_pages"] == (w.REPLAY - 1) // w.PAGE == 18
    assert rep["tier_usable_pages"] == resume_at // w.PAGE
    assert rep["resume_tokens"] == resume_at and rep["gpu_hit_tokens"] == 0
    assert rep["computed_tokens"] == w.REPLAY - resume_at == (22 if hybrid else 6)
    a, b = got["replay"]["logits"], want["replay"]["logits"]
    assert a.shape == (w.REPLAY - resume_at, 256)
    assert torch.equal(a, b), f"max |diff| {(a.float() - b.float()).abs().max()}"
