"""Keeps the GPU churn benchmark (python/bench/churn.py) runnable: a tiny
CPU run of the same script, whose JSON must show the scenario happened (the
auxiliary requests evicted the conversation from the engine's pool, the next
turn rehydrated all of it from kvtier and computed only its new tokens) and
that the tiered logits equal the full recompute's bit for bit."""

import json
import os
import subprocess
import sys

from conftest import PY_ROOT, child_env


def test_churn_runs_on_cpu(daemon, tmp_path):
    out = tmp_path / "churn.json"
    r = subprocess.run(
        [sys.executable, os.path.join(PY_ROOT, "bench", "churn.py"), "--arch", "llama",
         "--size", "tiny", "--device", "cpu", "--context", "512", "--turn", "40",
         "--aux", "10", "--aux-tokens", "128", "--chunk", "64", "--page", "8",
         "--repeats", "1", "--socket", daemon.socket, "--out", str(out)],
        env=child_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    assert d["gpu_resident_tokens_after_aux"] == 0
    assert d["turn1_stored_pages"] == 512 // 8 and d["turn1_commit_errors"] == 0
    assert d["cached_tokens"] == d["tier_hit_tokens"] == 512
    assert d["computed_tokens_tier"] == 40
    assert d["runs"][0]["recomputed_tokens"] == 552
    assert d["rehydrated_bytes"] == 64 * d["page_bytes"]
    assert d["logits_bit_identical"] and d["argmax_match"]
    assert d["rehydrate_gbps"] > 0 and d["evict_gbps"] > 0
