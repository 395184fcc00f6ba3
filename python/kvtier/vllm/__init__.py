"""kvtier for vLLM: `KvtierConnector`, a v1 KV connector (see docs/vllm.md).

    --kv-transfer-config '{"kv_connector": "KvtierConnector",
                           "kv_connector_module_path": "kvtier.vllm",
                           "kv_role": "kv_both"}'

The connector class imports vLLM; the worker and scheduler halves
(kvtier.vllm.worker, kvtier.vllm.scheduler) do not, so they can be driven
without vLLM (the GPU test does). KvtierConnector is loaded on first access.
"""

__all__ = ["KvtierConnector"]


def __getattr__(name):
    if name == "KvtierConnector":
        from .connector import KvtierConnector
        return KvtierConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
