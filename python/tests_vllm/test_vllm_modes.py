"""vLLM on kvtier in two modes a deployment meets: speculative decoding
(ngram) and a daemon that stalls while vLLM starts. Real vLLM CPU engines
and a real kvtierd, as in test_vllm_connector.py.

- Speculative decoding stores only verified tokens' blocks (draft tokens
  may be rejected): a restarted ngram engine is served the prompt's blocks
  with logprobs bit-identical to the first engine's own-cache repeat; a
  test-only fault perturbing a later load makes the same comparison fail.
- A daemon SIGSTOPped while vLLM starts: the connector's attach runs on a
  thread of its own, so vLLM starts, and the first request is answered while
  the daemon is still stopped (it cannot have attached); once the daemon
  runs again the connector attaches, says how many lookups and stores it
  skipped meanwhile, and stores.
"""

import os
import signal
import time

from conftest import PROMPT, make_model, namespaces

import kvtier

FULL = 8 * 128  # the 1,100-token prompts' full blocks
NGRAM = {"method": "ngram", "num_speculative_tokens": 3,
         "prompt_lookup_min": 2, "prompt_lookup_max": 4}


def gen(p, **kw):
    return dict({"op": "generate", "prompt": p, "max_tokens": 16, "logprobs": 20}, **kw)


def script(model, socket, steps, **kw):
    return dict({"arch": "llama", "model": model, "socket": socket,
                 "extra": {"retry_s": 0.2}, "steps": steps}, **kw)


def generated(engine):
    return [r for r in engine.results() if r["op"] == "generate"]


def test_ngram_engine_reloads_bit_identical(daemon, start_engine):
    model = make_model("llama")
    # Repeating prompts, so that ngram proposes drafts from them.
    p1 = [(i * 7) % 97 + 1 for i in range(1100)]
    p2 = [(i * 11) % 89 + 3 for i in range(1100)]
    e1 = start_engine(script(model, daemon.socket, [gen(p1), gen(p1), gen(p2), gen(p2)],
                             speculative=NGRAM))
    first, ref1, _, ref2 = generated(e1)
    assert first["num_cached_tokens"] == 0 and ref1["num_cached_tokens"] >= FULL
    e2 = start_engine(script(model, daemon.socket, [gen(p1), gen(p2)], speculative=NGRAM),
                      env={"KVTIER_VLLM_FAULT": "corrupt-load:0:2"})
    restored, perturbed = generated(e2)
    assert restored["num_cached_tokens"] >= FULL and perturbed["num_cached_tokens"] >= FULL
    assert restored["logprobs"] == ref1["logprobs"]
    assert perturbed["logprobs"] != ref2["logprobs"]  # the negative control


def test_a_daemon_stalled_at_start_is_attached_in_the_background(start_engine, tmp_path):
    model = make_model("llama")
    f = {k: str(tmp_path / k) for k in ("served", "resumed")}
    p2 = [(i * 13) % 991 + 3 for i in range(1100)]
    with kvtier.Daemon(flags=["--default_namespace_bytes=268435456"]) as d:
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            e = start_engine(script(model, d.socket, [
                gen(PROMPT, max_tokens=4), {"op": "touch", "path": f["served"]},
                {"op": "wait", "path": f["resumed"]}, {"op": "sleep", "seconds": 2},
                gen(p2, max_tokens=4), gen(p2, max_tokens=4)]))
            deadline = time.monotonic() + 600
            while not os.path.exists(f["served"]):
                assert e.proc.poll() is None, e.log()[-6000:]
                assert time.monotonic() < deadline
                time.sleep(0.1)
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        open(f["resumed"], "w").close()
        first, stored, _ = generated(e)
        assert first["num_cached_tokens"] == 0 and len(first["token_ids"]) == 4
        log = e.log()
        assert "scheduler attached" in log and "stores were skipped" in log, log[-6000:]
        ns = [n for n in namespaces(d.socket) if n["name"].startswith("vllm-")]
        assert len(ns) == 1 and int(ns[0]["pages"]) >= 8, ns  # p2, once attached
