"""KvtierConnector: vLLM's v1 KV connector over kvtier.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/kvtier/kvtierd.sock"}}'

A thin adapter: vLLM's hooks are translated to the vLLM-free scheduler
(scheduler.py) and worker (worker.py) halves, whose jobs and reports
(data.py) ride in this module's connector metadata. It subclasses
KVConnectorBase_V1 directly (not an OffloadingSpec under vLLM's
OffloadingConnector) because kvtier's index lives in the daemon, shared by
every engine of the node: lookups pin rows with leases, stores are
reservations committed by hash — none of which fits OffloadingSpec's
in-process block-pool manager (see docs/vllm.md). SupportsHMA: vLLM keeps
its hybrid KV cache manager on; hybrid models store their recurrent state at
page boundaries in the namespace's snapshot bank.

Loads are asynchronous in vLLM's sense (the request waits a step while the
worker copies on the engine's stream, and is reported through
get_finished), so that what vLLM does before a forward pass — the Mamba
"align" state copies among it — reads loaded blocks; stores are
write-through after the forward pass. Failed loads are reported through
failed_recving, so vLLM's kv_load_failure_policy applies.

Thread-safety: as vLLM calls connectors (one thread per role).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Iterable
from typing import Any

import torch

from vllm.distributed.kv_events import BlockStored
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole,
    KVConnectorTransferResults, KVConnectorWorkerMetadata, SupportsHMA)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

try:
    from vllm.v1.kv_cache_interface import MLAAttentionSpec
except ImportError:  # older vLLM
    MLAAttentionSpec = None

try:
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
except ImportError:  # older vLLM
    CacheHitSource = None

from .config import ConnectorConfig
from .data import LoadJob, StepReport, StoreJob
from .layout import (CacheDescription, Group, NamespaceIdentity, Placement, Ranks,
                     namespace_layout)
from .scheduler import KvtierScheduler
from .worker import KvtierWorker

log = logging.getLogger("kvtier.vllm")

_XXHASH_ALGOS = ("xxhash", "xxhash_cbor")
# Exactly these (not their subclasses, which evict or place blocks
# differently: RSWA, attention sinks, hidden-state caches).
_ATTENTION_SPECS = tuple(t for t in (FullAttentionSpec, MLAAttentionSpec) if t)


@dataclasses.dataclass
class KvtierMetadata(KVConnectorMetadata):
    """The scheduler's jobs of a step (data.py), for every worker."""
    loads: list[LoadJob] = dataclasses.field(default_factory=list)
    stores: list[StoreJob] = dataclasses.field(default_factory=list)


class KvtierWorkerMetadata(KVConnectorWorkerMetadata):
    """The workers' StepReports of a step, one per rank: vLLM merges its
    workers' metadata with aggregate(); the scheduler counts a load or store
    done only once every rank reported it (tally.py), so nothing is merged
    across ranks here."""

    def __init__(self, reports: dict[int, StepReport]):
        self.reports = dict(reports)

    def aggregate(self, other: "KvtierWorkerMetadata") -> "KvtierWorkerMetadata":
        clash = self.reports.keys() & other.reports.keys()
        if clash:
            raise ValueError(f"kvtier: two step reports of rank {min(clash)}")
        return KvtierWorkerMetadata({**self.reports, **other.reports})


@dataclasses.dataclass
class KvtierConnectorStats(KVConnectorStats):
    """Counters since the last interval: hits, misses, bytes, seconds."""

    def reset(self):
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in (other.data or {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


def describe_cache(kv_cache_config, dtype: str) -> CacheDescription:
    """The plain description (layout.py) of vLLM's KVCacheConfig."""
    groups, page_of_layer = [], {}
    for g in kv_cache_config.kv_cache_groups:
        spec = g.kv_cache_spec
        window = 0
        if isinstance(spec, MambaSpec):
            kind = "mamba"
        elif type(spec) in _ATTENTION_SPECS:
            kind = "attention"
        elif type(spec) is SlidingWindowSpec:  # not its subclasses
            kind, window = "sliding", int(spec.sliding_window)
        else:
            kind = "other"
        groups.append(Group(kind, int(spec.block_size), tuple(g.layer_names), window))
        for name in g.layer_names:
            page_of_layer[name] = int(spec.page_size_bytes)
    placements = []
    for t in kv_cache_config.kv_cache_tensors:
        page = max((page_of_layer.get(n, 0) for n in t.layers), default=0)
        placements.append(Placement(tuple(t.layers), int(t.layer_stride),
                                    int(t.block_stride), page, int(t.offset)))
    bs = groups[0].block_size if groups else 0
    hash_bs = int(getattr(kv_cache_config, "hash_block_size", None) or bs)
    return CacheDescription(num_blocks=int(kv_cache_config.num_blocks),
                            placements=tuple(placements), groups=tuple(groups),
                            hash_block_size=hash_bs, dtype=dtype)


def _config_digest(model_config) -> str:
    """config.json as on disk (a redeploy under the same path) and as vLLM
    uses it (--hf-overrides)."""
    h = hashlib.sha256()
    path = os.path.join(str(model_config.model), "config.json")
    if os.path.isfile(path):
        with open(path, "rb") as f:
            h.update(f.read())
    h.update(model_config.hf_config.to_json_string().encode())
    return h.hexdigest()


def _cache_digest(kv_cache_config, cache: CacheDescription) -> str:
    """What decides the bytes of a row beyond their count: the physical KV
    layout vLLM resolved, each group's spec, and the regions a row is cut
    from (two engines whose rows have equal sizes but another element order
    must never share a namespace)."""
    parts = [str(getattr(kv_cache_config, "kv_cache_layout", None))]
    for g in kv_cache_config.kv_cache_groups:
        parts.append(repr(g.kv_cache_spec))
    parts.append(repr(cache.regions()))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def identity_of(vllm_config, cache_digest: str = "") -> NamespaceIdentity:
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    return NamespaceIdentity(
        model=str(mc.model), revision=str(mc.revision or ""),
        config_digest=_config_digest(mc), dtype=str(mc.dtype).replace("torch.", ""),
        kv_cache_dtype=str(cc.cache_dtype), block_size=int(cc.block_size),
        tp_size=int(pc.tensor_parallel_size), pp_size=int(pc.pipeline_parallel_size),
        hash_algo=str(cc.prefix_caching_hash_algo), cache_digest=cache_digest)


def ranks_of(vllm_config, kv_cache_config) -> Ranks:
    """The engine's workers as namespace ranks; MLA latents (the same on
    every TP rank) are stored once per engine."""
    pc = vllm_config.parallel_config
    tp = int(pc.tensor_parallel_size)
    mla = MLAAttentionSpec is not None and any(
        type(g.kv_cache_spec) is MLAAttentionSpec for g in kv_cache_config.kv_cache_groups)
    return Ranks(tp, int(pc.pipeline_parallel_size), replicated=mla and tp > 1)


def rank_of_this_worker(ranks: Ranks) -> int:
    """This worker process's namespace rank (vLLM's process groups)."""
    if ranks.world == 1:
        return 0
    from vllm.distributed.parallel_state import get_pp_group, get_tp_group
    return ranks.rank(get_tp_group().rank_in_group, get_pp_group().rank_in_group)


def _check_pipeline(vllm_config) -> None:
    """Every PP stage's rows must have one size and structure (a namespace
    has one layout for all ranks): refuses uneven layer splits."""
    pc = vllm_config.parallel_config
    pp = int(pc.pipeline_parallel_size)
    if pp == 1:
        return
    from vllm.distributed.utils import get_pp_indices
    text = vllm_config.model_config.hf_text_config
    layers = int(text.num_hidden_layers)
    spans = [get_pp_indices(layers, r, pp) for r in range(pp)]
    sizes = [end - start for start, end in spans]
    types = getattr(text, "layer_types", None)
    uneven = len(set(sizes)) > 1
    if not uneven and types and len(types) >= layers:
        uneven = len({tuple(types[a:b]) for a, b in spans}) > 1
    if uneven:
        raise ValueError(
            f"kvtier: pipeline_parallel_size={pp} splits the model's {layers} "
            f"layers into stages of {sizes} layers"
            + (" of different kinds" if len(set(sizes)) == 1 else "")
            + ": every stage is a rank of one namespace with one row size, so "
            "the stages must hold alike layers; choose a pipeline_parallel_size "
            "that divides the layers evenly or set VLLM_PP_LAYER_PARTITION to "
            "equal parts (docs/vllm.md, \"Parallel engines\")")


def instance_of(kv_transfer_config) -> bytes | None:
    """The client instance (fence protocol) of this engine's processes: 16
    bytes of a hash of vLLM's engine_id, which the scheduler and its workers
    share (vLLM draws it once per engine). None without one: each process
    is then an instance of its own."""
    engine_id = getattr(kv_transfer_config, "engine_id", None)
    if not engine_id:
        return None
    return hashlib.sha256(b"kvtier-instance\0" + str(engine_id).encode()).digest()[:16]


def check_engine(vllm_config) -> None:
    """Refuses configurations the connector cannot serve correctly."""
    cc, pc = vllm_config.cache_config, vllm_config.parallel_config
    algo = str(cc.prefix_caching_hash_algo)
    if algo in _XXHASH_ALGOS and os.environ.get("PYTHONHASHSEED") is None:
        raise ValueError(
            f"kvtier: prefix_caching_hash_algo={algo!r} seeds every process's "
            f"block hashes at random unless PYTHONHASHSEED is set, so restarted "
            f"and sibling engines would never share the tier: set PYTHONHASHSEED "
            f"to the same value for every vLLM process of the node, or use sha256 "
            f"(docs/vllm.md, \"Configuration\")")
    _check_pipeline(vllm_config)
    if not cc.enable_prefix_caching:
        raise ValueError("kvtier: needs enable_prefix_caching (vLLM's block "
                         "hashes are the tier's keys; docs/vllm.md, "
                         "\"Configuration\")")


def check_cache(vllm_config, cache: CacheDescription) -> None:
    """Refuses what the engine's KV cache cannot do with the tier."""
    if cache.hybrid and vllm_config.speculative_config is not None:
        raise ValueError(
            "kvtier: speculative_config with a hybrid model is not supported "
            "(vLLM writes the recurrent state of draft tokens where the "
            "connector cannot tell the verified state apart): serve this "
            "model without speculative decoding (docs/vllm.md, "
            "\"Configuration\")")


def _log_like_vllm() -> None:
    """kvtier's messages go where vLLM's go (its handlers, its level)."""
    vllm_log = logging.getLogger("vllm")
    if log.handlers or not vllm_log.handlers:
        return
    for h in vllm_log.handlers:
        log.addHandler(h)
    log.setLevel(vllm_log.level or logging.INFO)
    log.propagate = False


class KvtierConnector(KVConnectorBase_V1, SupportsHMA):
    if CacheHitSource is not None:
        _cache_hit_source = CacheHitSource.HOST

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a dropped store is a later miss

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role,
                         kv_cache_config=kv_cache_config)
        _log_like_vllm()
        self.config = ConnectorConfig.parse(self._kv_transfer_config.kv_connector_extra_config)
        check_engine(vllm_config)
        cc, mc = vllm_config.cache_config, vllm_config.model_config
        dtype = str(cc.cache_dtype)
        if dtype == "auto":
            dtype = str(mc.dtype).replace("torch.", "")
        self.cache = describe_cache(kv_cache_config, dtype)
        check_cache(vllm_config, self.cache)
        self.identity = identity_of(vllm_config, _cache_digest(kv_cache_config, self.cache))
        self.ranks = ranks_of(vllm_config, kv_cache_config)
        policy = getattr(self._kv_transfer_config, "kv_load_failure_policy", "recompute")
        if policy != "recompute" and role == KVConnectorRole.SCHEDULER:
            log.warning("kvtier: kv_load_failure_policy=%r: a load that fails "
                        "fails its request; 'recompute' makes it a miss", policy)
        hash_bytes = 16 if str(cc.prefix_caching_hash_algo) in _XXHASH_ALGOS else 32
        self.layout = namespace_layout(self.cache, self.identity, hash_bytes, self.ranks)
        self.ns_name = self.config.namespace or self.identity.default_name()
        self._scheduler: KvtierScheduler | None = None
        self._worker: KvtierWorker | None = None
        self._report: StepReport | None = None  # the worker's, this step
        self._sent_attached: bool | None = None
        # One client instance for the scheduler and every worker of this
        # engine (vLLM hands them the same engine_id): the daemon fences
        # the rows the scheduler leased for as long as any of them may still
        # read them, daemon restarts included.
        instance = instance_of(self._kv_transfer_config)
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = KvtierScheduler(self.config, self.ns_name, self.layout,
                                              self.cache, instance=instance,
                                              ranks=self.ranks)
            # A layout a namespace refuses, or an ACL that refuses this
            # engine, is a start-up error. The worker attached (or not)
            # before the scheduler is built.
            self._scheduler.worker_ready = self._scheduler.link.attach_all()
        else:
            self._worker = KvtierWorker(self.config, self.ns_name, self.layout, self.cache,
                                        instance=instance, ranks=self.ranks,
                                        rank=rank_of_this_worker(self.ranks),
                                        background=True)
        tenants = len(self.config.tenant_namespaces)
        where = "" if self.ranks.world == 1 else (
            f", rank {self._worker.rank if self._worker else 0} of "
            f"TP {self.ranks.tp_size} x PP {self.ranks.pp_size}"
            + (" (MLA: one copy for every TP rank)" if self.ranks.replicated else ""))
        log.info("kvtier: %s connector, namespace %r%s, %d-token blocks of %d bytes%s%s",
                 role.name.lower(), self.ns_name,
                 f" and {tenants} tenant cache salts mapped" if tenants else "",
                 self.cache.block_size, self.cache.row_bytes,
                 ", hybrid" if self.cache.hybrid else "", where)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config) -> str | None:
        """Block-first on GPUs: a block is one contiguous run, one copy-engine
        descriptor per page (the layout that keeps the link full beside
        compute). The CPU backend takes only its own layout."""
        extra = (vllm_config.kv_transfer_config.kv_connector_extra_config or {}) \
            if vllm_config.kv_transfer_config else {}
        layout = ConnectorConfig.parse(extra).kv_cache_layout
        if layout == "auto":
            return "BLHNC" if vllm_config.device_config.device_type == "cuda" else None
        return None if layout == "none" else layout

    # ---- worker side -----------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        first = None
        for value in kv_caches.values():
            ts = value if isinstance(value, (list, tuple)) else [value]
            if ts:
                first = ts[0]
                break
        if first is None or self._worker is None:
            return
        storage = first.untyped_storage()
        buffer = torch.empty(0, dtype=torch.uint8, device=first.device).set_(storage)
        for name, value in kv_caches.items():
            for t in value if isinstance(value, (list, tuple)) else [value]:
                if t.untyped_storage().data_ptr() != storage.data_ptr():
                    raise ValueError(f"kvtier: KV cache {name!r} is not in the one "
                                     f"backing buffer vLLM >= 0.32 allocates")
        self._worker.register(buffer)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._connector_metadata
        if self._worker is not None and isinstance(meta, KvtierMetadata):
            self._worker.load(meta.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        return

    def wait_for_save(self):
        meta = self._connector_metadata
        if self._worker is not None and isinstance(meta, KvtierMetadata):
            self._worker.store(meta.stores)

    def get_transfer_results(self, finished_req_ids: set[str]):
        """Loads whose copies completed this step, and those that failed
        (also in finished_recving, as vLLM requires). Failures are reported
        per request: block ids are not unique across a hybrid model's
        groups. vLLM calls this first of the per-step reports; the others
        read the same StepReport."""
        if self._worker is None:
            return KVConnectorTransferResults()
        self._report = self._worker.poll()
        r = self._report
        return KVConnectorTransferResults(finished_recving=r.loaded | r.failed_loads,
                                          failed_recving=set(r.failed_loads))

    def build_connector_worker_meta(self):
        report = self._report
        self._report = None
        if report is None or self._worker is None:
            return None
        changed = report.attached != self._sent_attached
        self._sent_attached = report.attached
        if not (changed or report.loaded or report.failed_loads or report.stored
                or report.failed_stores):
            return None
        return KvtierWorkerMetadata({report.rank: report})

    def get_kv_connector_stats(self):
        part = getattr(self, "_worker", None) or getattr(self, "_scheduler", None)
        if part is None:
            return None
        stats = KvtierConnectorStats(data=part.stats.take())
        return None if stats.is_empty() else stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        return KvtierConnectorStats(data=dict(data or {}))

    def shutdown(self):
        for part in (self._worker, self._scheduler):
            if part is not None:
                part.close()

    # ---- scheduler side ----------------------------------------------------------

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        if self._scheduler is None or getattr(request, "skip_reading_prefix_cache", False):
            return 0, False
        hit = self._scheduler.matched_tokens(request, num_computed_tokens)
        if hit is None:
            # The cluster tier's prefetch is bringing the prefix into the
            # host tier: vLLM skips the request this step and asks again.
            return None, False
        return hit, hit > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        if self._scheduler is not None:
            self._scheduler.after_alloc(request, blocks.get_block_ids(),
                                        num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = KvtierMetadata()
        s = self._scheduler
        if s is None:
            return meta
        meta.loads = s.take_loads()
        so = scheduler_output
        scheduled = [(r.req_id, r.num_computed_tokens) for r in so.scheduled_new_reqs]
        cached = so.scheduled_cached_reqs
        scheduled += list(zip(cached.req_ids, cached.num_computed_tokens))
        spec = getattr(so, "scheduled_spec_decode_tokens", None) or {}
        for req_id, computed in scheduled:
            # Draft tokens may be rejected: only what is verified is stored.
            n = so.num_scheduled_tokens.get(req_id, 0) - len(spec.get(req_id, ()))
            if (n <= 0 or self._kv_cache_manager is None
                    or not s.has_new_pages(req_id, computed + n)):
                continue
            job = s.plan_store(req_id, computed + n,
                               self._kv_cache_manager.get_block_ids(req_id))
            if job is not None:
                meta.stores.append(job)
        return meta

    def update_connector_output(self, connector_output):
        if self._scheduler is None:
            return
        self._scheduler.loads_done(connector_output.finished_recving or ())
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(meta, KvtierWorkerMetadata):
            for rank in sorted(meta.reports):
                self._scheduler.on_report(meta.reports[rank])

    def request_finished(self, request, block_ids):
        if self._scheduler is not None:
            self._scheduler.finished(request.request_id)
        return False, None

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids)

    def take_events(self) -> Iterable[BlockStored]:
        if self._scheduler is None:
            return ()
        events = []
        for s in self._scheduler.take_stored():
            events.append(BlockStored(
                block_hashes=list(s.hashes), parent_block_hash=s.parent,
                token_ids=list(s.token_ids), block_size=self.cache.block_size,
                lora_id=None, medium="CPU", lora_name=None))
        return events

    def reset_cache(self) -> bool | None:
        return None  # the tier is the node's, not this engine's
