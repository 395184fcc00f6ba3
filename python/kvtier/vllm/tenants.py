"""Tenants in namespaces of their own: which namespace a request's KV goes to.

A kvtier namespace is one trust domain: every engine attached to it maps all
of its rows read-write and may commit any bytes under any hash it can
compute. vLLM's cache salt keeps tenants' lookups apart (it is inside the
block hashes), not their memory. Tenants that must not share memory get
namespaces of their own, which kvtierd's --namespace_acl gives to their
engines alone:

    kv_connector_extra_config = {"tenant_namespaces": {SALT: TENANT, ...}}

A request whose cache salt is SALT uses namespace `TENANT.<namespace>`,
where <namespace> is the engine's own (the `namespace` key, else the name
digested from the model identity): the tenant's namespaces are those the
ACL pattern `TENANT.*` governs, and a redeployed model still never shares a
namespace with the old one. A request without a cache salt uses the
engine's namespace. A request whose salt is in no entry is, by
`unmapped_salts`, not cached at all ("skip", the default: a tenant nobody
mapped never lands in memory other engines share) or served from the
engine's namespace ("default"). The map is fixed at start; never one
namespace per request.

Thread-safety: TenantMap is immutable.
"""

from __future__ import annotations

MAX_NAMESPACE = 128  # kvtierd's limit on a namespace name
KEY = "kv_connector_extra_config['tenant_namespaces']"


class TenantMap:
    """cache salt -> namespace, from a parsed ConnectorConfig.

    Args:
      pairs: (salt, tenant) pairs (ConnectorConfig.tenant_namespaces).
      unmapped: "skip" or "default" (ConnectorConfig.unmapped_salts).
      default: the engine's own namespace.

    Raises ValueError naming the key when a tenant's namespace name would be
    longer than kvtierd accepts.
    """

    def __init__(self, pairs: tuple[tuple[str, str], ...], unmapped: str,
                 default: str):
        self.default = default
        self.unmapped = unmapped
        self._by_salt: dict[str, str] = {}
        self._tenant_of: dict[str, str] = {}
        for salt, tenant in pairs:
            name = f"{tenant}.{default}"
            if len(name) > MAX_NAMESPACE:
                raise ValueError(
                    f"{KEY}: tenant {tenant!r} makes namespace {name!r}, "
                    f"{len(name)} characters; kvtierd takes at most "
                    f"{MAX_NAMESPACE}: use a shorter tenant name (or namespace)")
            self._by_salt[salt] = name
            self._tenant_of[name] = tenant
        # The engine's namespace first, then each tenant's once.
        self.namespaces: tuple[str, ...] = (default, *sorted(self._tenant_of))

    @classmethod
    def of(cls, config, default: str) -> "TenantMap":
        return cls(config.tenant_namespaces, config.unmapped_salts, default)

    def route(self, salt: str | None) -> str | None:
        """The namespace of a request whose cache salt is `salt`; None: the
        request is not cached (neither looked up nor stored)."""
        if not salt:
            return self.default
        name = self._by_salt.get(salt)
        if name is not None:
            return name
        if self._by_salt and self.unmapped == "skip":
            return None
        return self.default

    def tenant_of(self, name: str) -> str | None:
        """The tenant whose namespace `name` is; None for the engine's own."""
        return self._tenant_of.get(name)
