"""A vLLM engine with the kvtier connector, driven by a JSON script: the
process the vLLM tests start (once per engine, as a user would).

    python engine.py SCRIPT.json OUT.jsonl   # one JSON line per step in OUT

SCRIPT: {"arch": "llama" | "qwen3_next" | "qwen3_next_8" | "gemma3", "model": DIR, "socket": PATH or
null (no connector), "extra": {...} (kv_connector_extra_config), "tp": N?,
"pp": N? (vLLM's multiprocessing executor: one worker process per rank),
"speculative": {...}? (vLLM's speculative_config), "compile": true? (vLLM's
torch.compile default; else enforce_eager),
"steps": [...]}; a step is one of
  {"op": "generate", "prompt": [ids], "max_tokens": N, "logprobs": K,
   "cache_salt": S?}      -> num_cached_tokens, token ids, top-K logprobs
                              (float.hex, so equality is bit equality)
  {"op": "touch", "path": P}          creates P (a signal to the test)
  {"op": "wait", "path": P}           waits until P exists (the test's go)
  {"op": "sleep", "seconds": S}
  {"op": "abort_many", "prompt": [ids], "count": N}
                              N requests admitted one step, then aborted
  {"op": "generate_many", "prompts": [[ids], ...], "max_tokens": N}
                              one batch, outputs dropped (auxiliary load)

Models are tiny configs with seeded random weights (conftest.make_model);
nothing is downloaded. Imports vLLM: run it with the vLLM venv's Python.
"""

import json
import os
import sys
import time


def llm_for(script):
    from vllm import LLM
    # Eager unless the script asks for vLLM's compiled default: the
    # connector is the same either way (comparisons stay within one engine
    # configuration), and an eager engine starts in about 17 s here instead
    # of 44 (torch.compile). vllm_serve runs `vllm serve` compiled, and the
    # benchmark compiles.
    kw = dict(model=script["model"], skip_tokenizer_init=True,
              enforce_eager=not script.get("compile", False),
              dtype="bfloat16", enable_prefix_caching=True,
              max_model_len=script.get("max_model_len", 2048), seed=0,
              max_num_seqs=script.get("max_num_seqs", 8))
    if script.get("kv_events_endpoint"):
        kw["kv_events_config"] = {"enable_kv_cache_events": True, "publisher": "zmq",
                                  "endpoint": script["kv_events_endpoint"]}
    for key in ("num_gpu_blocks_override", "max_num_batched_tokens", "block_size"):
        if script.get(key):
            kw[key] = script[key]
    if script.get("speculative"):
        kw["speculative_config"] = script["speculative"]
    if script.get("tp", 1) > 1 or script.get("pp", 1) > 1:
        kw.update(tensor_parallel_size=script.get("tp", 1),
                  pipeline_parallel_size=script.get("pp", 1),
                  distributed_executor_backend="mp")
    if script["arch"].startswith("qwen3_next"):
        kw["mamba_cache_mode"] = "align"
    if script.get("socket") is not None or script.get("extra"):
        extra = dict(script.get("extra") or {})
        if script.get("socket") is not None:
            extra["socket"] = script["socket"]
        kw["kv_transfer_config"] = {
            "kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm",
            "kv_role": "kv_both", "kv_connector_extra_config": extra}
    return LLM(**kw)


def generate(llm, step):
    from vllm import SamplingParams
    sp = SamplingParams(max_tokens=step.get("max_tokens", 16), temperature=0,
                        logprobs=step.get("logprobs", 20), detokenize=False,
                        ignore_eos=True)
    prompt = {"prompt_token_ids": step["prompt"]}
    if step.get("cache_salt"):
        prompt["cache_salt"] = step["cache_salt"]
    t0 = time.perf_counter()
    out = llm.generate([prompt], sp, use_tqdm=False)[0]
    seconds = time.perf_counter() - t0
    comp = out.outputs[0]
    return {"num_cached_tokens": out.num_cached_tokens, "token_ids": list(comp.token_ids),
            "logprobs": [sorted((int(t), float(lp.logprob).hex()) for t, lp in d.items())
                         for d in comp.logprobs],
            "seconds": seconds}


def generate_many(llm, step):
    from vllm import SamplingParams
    sp = SamplingParams(max_tokens=step.get("max_tokens", 1), temperature=0,
                        detokenize=False, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in step["prompts"]], sp,
                        use_tqdm=False)
    return {"requests": len(outs), "seconds": time.perf_counter() - t0}


def abort_many(llm, step):
    from vllm import SamplingParams
    engine = llm.llm_engine
    ids = [f"abort-{i}" for i in range(step["count"])]
    sp = SamplingParams(max_tokens=64, detokenize=False, ignore_eos=True)
    for rid in ids:
        engine.add_request(rid, {"prompt_token_ids": step["prompt"]}, sp)
    engine.step()  # admitted: looked up (and pinned), some loaded
    engine.abort_request(ids)
    steps = 0
    while engine.has_unfinished_requests():  # step() blocks when idle
        engine.step()
        steps += 1
    return {"aborted": len(ids), "steps_after_abort": steps}


def main():
    script = json.load(open(sys.argv[1]))
    out = open(sys.argv[2], "a", buffering=1)  # vLLM logs to stdout
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    llm = llm_for(script)
    print(json.dumps({"op": "ready"}), file=out)
    for step in script["steps"]:
        op = step["op"]
        if op == "generate":
            result = generate(llm, step)
        elif op == "touch":
            open(step["path"], "w").close()
            result = {}
        elif op == "wait":
            deadline = time.time() + step.get("timeout", 300)
            while not os.path.exists(step["path"]):
                if time.time() > deadline:
                    raise SystemExit(f"timed out waiting for {step['path']}")
                time.sleep(0.05)
            result = {}
        elif op == "sleep":
            time.sleep(step["seconds"])
            result = {}
        elif op == "generate_many":
            result = generate_many(llm, step)
        elif op == "abort_many":
            result = abort_many(llm, step)
        else:
            raise SystemExit(f"unknown op {op!r}")
        print(json.dumps(dict(result, op=op)), file=out)


if __name__ == "__main__":
    main()
