"""The connector's configuration: `kv_connector_extra_config`, checked.

Every key is listed in KEYS with its type and default; an unknown key or a
value of the wrong type is a ValueError naming the key, raised when vLLM
builds the connector (at start), never later. Nothing here imports vLLM.

Thread-safety: ConnectorConfig is immutable.
"""

from __future__ import annotations

import dataclasses
import os
import re

# key -> (accepted Python types, default, what it is). Documented in
# docs/vllm.md; keep the two in step.
KEYS: dict[str, tuple[tuple[type, ...], object, str]] = {
    "socket": ((str,), None,
               "kvtierd's unix socket; unset: $KVTIER_SOCKET, "
               "/run/kvtier/kvtierd.sock, then the per-user default"),
    "namespace": ((str,), None,
                  "namespace name; unset: derived from the model identity"),
    "host_bytes": ((int,), 0,
                   "size of the page bank when this engine creates the "
                   "namespace; 0: the daemon's --default_namespace_bytes"),
    "snapshot_rows": ((int,), 0,
                      "snapshot rows when this engine creates a hybrid "
                      "model's namespace; 0: the daemon's default"),
    "store": ((str,), "all",
              "'all': every newly computed full block is written to the "
              "tier; 'none': read only"),
    "timeout_ms": ((int,), 500,
                   "deadline of each daemon call the scheduler makes"),
    "retry_s": ((int, float), 5.0,
                "seconds between attempts to reach a daemon that is down"),
    "kv_cache_layout": ((str,), "auto",
                        "the KV cache layout asked of vLLM: 'auto' (block-first "
                        "BLHNC on GPUs, the backend's own on CPU), 'none', or a "
                        "vLLM layout name"),
    "client_name": ((str,), "vllm",
                    "shown to operators (kvtierctl status)"),
    "kv_event_tokens": ((bool,), False,
                        "send each stored page's token ids with its commit, "
                        "for kvtierd's KV events (--kv_events_endpoint): "
                        "BlockStored then carries them to routers"),
    "cluster": ((bool,), False,
                "also ask kvtierd's cluster tier (--cluster_redis): a request "
                "whose prefix continues there waits (vLLM's 'ask again "
                "later') while the daemon prefetches it into the host tier"),
    "cluster_wait_ms": ((int,), 10000,
                        "with 'cluster': the longest a request waits for its "
                        "prefetch before it is answered from the local match"),
    "tenant_namespaces": ((dict,), None,
                          "cache salt -> tenant: requests with that cache_salt "
                          "use namespace '<tenant>.<namespace>', which kvtierd's "
                          "--namespace_acl entry '<tenant>.*' gives to the "
                          "tenant's engines alone (see kvtier.vllm.tenants)"),
    "unmapped_salts": ((str,), "skip",
                       "with 'tenant_namespaces', a request whose cache salt "
                       "is in no entry: 'skip' (not cached) or 'default' (the "
                       "engine's namespace)"),
}

STORE_POLICIES = ("all", "none")
KV_CACHE_LAYOUTS = ("auto", "none", "LBNHC", "LBHNC", "LHBNC", "NHD", "HND",
                    "BLHNC", "BLNHC", "BHLNC")
UNMAPPED_SALTS = ("skip", "default")
# A tenant is the first component of its namespaces' names: no '.', so that
# the ACL pattern 'a.*' never governs tenant 'a.b''s namespaces.
TENANT_NAME = re.compile(r"[A-Za-z0-9_-]{1,96}")

# Test-only fault injection, read from the environment so that no user
# configuration can switch it on (Fault.parse says what each does).
FAULT_ENV = "KVTIER_VLLM_FAULT"


@dataclasses.dataclass(frozen=True)
class Fault:
    """A test-only fault ($KVTIER_VLLM_FAULT), in the workers of rank
    `rank` (None: every rank):
      corrupt-load[:RANK[:N]]  perturbs the first block of every load (from
                               the rank's N-th on, 1-based) after it was
                               copied in (wrong KV must show)
      refuse-store:RANK:PAGE   the rank refuses every store that reaches
                               page PAGE, as a refused Reserve would: the
                               ranks disagree without dying
      hang-store:RANK:PATH     once PATH.go exists, the rank's next store
                               reserves and copies, touches PATH and hangs
                               before its commit (for a SIGKILL mid-store)
    """
    kind: str = ""
    rank: int | None = None
    page: int = 0  # refuse-store: the page; corrupt-load: the first load
    path: str = ""

    @classmethod
    def parse(cls, text: str) -> "Fault":
        if not text:
            return cls()
        kind, _, rest = text.partition(":")
        try:
            if kind == "corrupt-load":
                rank, _, nth = rest.partition(":")
                return cls(kind, int(rank) if rank else None, page=int(nth or 1))
            if kind == "refuse-store":
                rank, page = rest.split(":")
                return cls(kind, int(rank), page=int(page))
            if kind == "hang-store":
                rank, path = rest.split(":", 1)
                if path:
                    return cls(kind, int(rank), path=path)
        except ValueError:
            pass
        raise ValueError(f"${FAULT_ENV}: {text!r} is not a known fault")

    def on(self, kind: str, rank: int) -> bool:
        return self.kind == kind and self.rank in (None, rank)


@dataclasses.dataclass(frozen=True)
class ConnectorConfig:
    socket: str | None = None
    namespace: str | None = None
    host_bytes: int = 0
    snapshot_rows: int = 0
    store: str = "all"
    timeout_ms: int = 500
    retry_s: float = 5.0
    kv_cache_layout: str = "auto"
    client_name: str = "vllm"
    kv_event_tokens: bool = False
    cluster: bool = False
    cluster_wait_ms: int = 10000
    # (cache salt, tenant) pairs, sorted by salt; () without a map.
    tenant_namespaces: tuple[tuple[str, str], ...] = ()
    unmapped_salts: str = "skip"
    fault: Fault = Fault()

    @classmethod
    def parse(cls, extra: dict | None) -> "ConnectorConfig":
        """Checks `extra` (kv_connector_extra_config) and fills defaults.

        Raises ValueError naming the key for an unknown key, a value of the
        wrong type or out of range.
        """
        extra = dict(extra or {})
        where = "kv_connector_extra_config"
        unknown = sorted(set(extra) - set(KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (known keys: "
                             f"{', '.join(sorted(KEYS))})")
        values = {}
        for key, (types, default, _) in KEYS.items():
            value = extra.get(key, default)
            if value is None and default is None:
                values[key] = None
                continue
            # bool is an int subclass: never accept it for a number.
            if (isinstance(value, bool) and bool not in types) or \
                    not isinstance(value, types):
                names = " or ".join(t.__name__ for t in types)
                raise ValueError(f"{where}[{key!r}]: expected {names}, got "
                                 f"{type(value).__name__} {value!r}")
            values[key] = value
        for key in ("host_bytes", "snapshot_rows"):
            if values[key] < 0:
                raise ValueError(f"{where}[{key!r}]: must be >= 0, got {values[key]}")
        if values["timeout_ms"] <= 0:
            raise ValueError(f"{where}['timeout_ms']: must be > 0, got "
                             f"{values['timeout_ms']}")
        if values["cluster_wait_ms"] <= 0:
            raise ValueError(f"{where}['cluster_wait_ms']: must be > 0, got "
                             f"{values['cluster_wait_ms']}")
        if values["retry_s"] <= 0:
            raise ValueError(f"{where}['retry_s']: must be > 0, got {values['retry_s']}")
        if values["store"] not in STORE_POLICIES:
            raise ValueError(f"{where}['store']: {values['store']!r} is not one of "
                             f"{', '.join(STORE_POLICIES)}")
        if values["kv_cache_layout"] not in KV_CACHE_LAYOUTS:
            raise ValueError(f"{where}['kv_cache_layout']: "
                             f"{values['kv_cache_layout']!r} is not one of "
                             f"{', '.join(KV_CACHE_LAYOUTS)}")
        if values["socket"] == "":
            raise ValueError(f"{where}['socket']: empty; leave it out for the default")
        values["tenant_namespaces"] = _tenant_pairs(values["tenant_namespaces"],
                                                    f"{where}['tenant_namespaces']")
        if values["unmapped_salts"] not in UNMAPPED_SALTS:
            raise ValueError(f"{where}['unmapped_salts']: "
                             f"{values['unmapped_salts']!r} is not one of "
                             f"{', '.join(UNMAPPED_SALTS)}")
        if "unmapped_salts" in extra and not values["tenant_namespaces"]:
            raise ValueError(f"{where}['unmapped_salts']: means nothing without "
                             f"a non-empty 'tenant_namespaces'")
        fault = Fault.parse(os.environ.get(FAULT_ENV, ""))
        return cls(retry_s=float(values.pop("retry_s")), fault=fault, **values)


def _tenant_pairs(value: dict | None, where: str) -> tuple[tuple[str, str], ...]:
    """The checked (salt, tenant) pairs of `tenant_namespaces`. Raises
    ValueError naming `where` and the offending entry (never the salt's
    value, which may be a secret: its position in the map instead)."""
    if value is None:
        return ()
    pairs = []
    for i, (salt, tenant) in enumerate(value.items()):
        if not isinstance(salt, str) or not salt:
            got = "an empty string" if salt == "" else type(salt).__name__
            raise ValueError(f"{where}: entry {i}: a cache salt must be a "
                             f"non-empty string, got {got}")
        if not isinstance(tenant, str) or not TENANT_NAME.fullmatch(tenant):
            raise ValueError(f"{where}: entry {i}: tenant {tenant!r} is not "
                             f"1..96 characters of [A-Za-z0-9_-] (it becomes the "
                             f"first component of a namespace name)")
        pairs.append((salt, tenant))
    return tuple(sorted(pairs))
