"""The connector's line to kvtierd: connect and attach lazily, retry a daemon
that is down every `retry_s` seconds, warn once per outage.

Both halves of the connector (scheduler and worker) hold one TierLink: one
session for the engine's namespace and each tenant's (tenants.py). A
daemon that is not running when vLLM starts is not an error: namespace()
returns None (the connector then reports misses and stores nothing) and the
link tries again later. Once attached, libkvtier reconnects by itself after
a daemon restart (lookups are misses meanwhile, reserves fail UNAVAILABLE).
A namespace the daemon refuses to this engine (another layout under its
name, an ACL that does not allow the engine's uid) is a configuration
error, raised, never retried. A namespace no --namespace_acl entry governs
is shared with every engine that reaches the daemon: the scheduler's link
warns once per namespace when it attaches one.

Thread-safety: one thread at a time (vLLM calls a connector from one thread).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..client import Client, Layout, Namespace
from ..errors import (FailedPreconditionError, InvalidArgumentError, KvtierError,
                      PermissionDeniedError)
from .config import ConnectorConfig
from .tenants import KEY as TENANTS_KEY
from .tenants import TenantMap

log = logging.getLogger("kvtier.vllm")


class AttachRefused(RuntimeError):
    """The daemon refused this engine a namespace for good (its ACL does not
    allow the engine's uid): a configuration error, raised at start."""


class LayoutRefused(AttachRefused):
    """The daemon refused this engine's layout for the namespace (another
    layout under the same name): a configuration error, raised at start."""


class TierLink:
    """Owns a Client and the Namespaces attached through it.

    Args:
      config: the connector configuration (socket, timeout, retry interval).
      name: the engine's namespace (namespace() without a name).
      layout: the namespace layout (every namespace of the engine has it).
      role: "scheduler" or "worker", in the client name and the log.
      timeout_ms: the deadline of each daemon call (Attach, which may
        populate banks, always gets libkvtier's longer one).
      on_attach: called with the Namespace after each successful attach.
      clock: time source (seconds), for tests.
      instance: 16 bytes shared by the engine's processes (the fence
        protocol: the daemon keeps rows the scheduler leased while the
        worker may still read them, across daemon restarts); None: this
        process alone.
      tenants: the tenants' namespaces (they are attached too); None: the
        engine's namespace alone.
      warn_open: warn once per namespace that no --namespace_acl entry
        governs (one role of the engine says it).
    """

    def __init__(self, config: ConnectorConfig, name: str, layout: Layout,
                 role: str, on_attach: Callable[[Namespace], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 timeout_ms: int | None = None, instance: bytes | None = None,
                 tenants: TenantMap | None = None, warn_open: bool = False):
        self.config = config
        self.instance = instance
        self.name = name
        self.layout = layout
        self.role = role
        self.tenants = tenants or TenantMap((), config.unmapped_salts, name)
        self.names = self.tenants.namespaces
        self._on_attach = on_attach
        self._warn_open = warn_open
        self.timeout_ms = timeout_ms or config.timeout_ms
        self._clock = clock
        self._client: Client | None = None
        self._ns: dict[str, Namespace] = {}
        self._next_try: dict[str, float] = {}
        self._warned = False  # the daemon is unreachable, said once
        self._attach_warned: set[str] = set()

    @property
    def attached(self) -> bool:
        """Whether the engine's namespace is attached."""
        return self.name in self._ns

    def attached_to(self, name: str) -> bool:
        return name in self._ns

    def attach_all(self) -> set[str]:
        """Attaches every namespace that is due; the names attached. Raises
        AttachRefused as namespace() does."""
        return {n for n in self.names if self.namespace(n) is not None}

    def namespace(self, name: str | None = None) -> Namespace | None:
        """Namespace `name` (default: the engine's), attaching first if due;
        None while the daemon cannot be reached or will not attach it yet.
        Raises LayoutRefused when the daemon rejects the layout, and
        AttachRefused when its ACL does not allow this engine (never
        retried: the configuration is wrong)."""
        name = name or self.name
        ns = self._ns.get(name)
        if ns is not None:
            return ns
        if name not in self.names:
            raise KeyError(f"kvtier: namespace {name!r} is not one of this "
                           f"engine's ({', '.join(self.names)})")
        now = self._clock()
        if now < self._next_try.get(name, 0.0):
            return None
        self._next_try[name] = now + self.config.retry_s
        client = self._connect()
        if client is None:
            return None
        try:
            ns = client.attach(name, self.layout, page_rows=self._page_rows(),
                               snapshot_rows=self.config.snapshot_rows)
        except (InvalidArgumentError, FailedPreconditionError) as e:
            self._drop_idle_client()
            raise LayoutRefused(
                f"kvtier: namespace {name!r} refused this engine's layout "
                f"({e}); set kv_connector_extra_config['namespace'] to another "
                f"name or drop the namespace") from e
        except PermissionDeniedError as e:
            self._drop_idle_client()
            tenant = self.tenants.tenant_of(name)
            where = (f"{TENANTS_KEY} names tenant {tenant!r}, whose namespace"
                     if tenant is not None else "the engine's namespace")
            raise AttachRefused(
                f"kvtier: kvtierd refuses this engine namespace {name!r} ({e}): "
                f"{where} is governed by a --namespace_acl entry that allows "
                f"neither this engine's uid nor any of its groups; run the "
                f"engine as a user the entry allows"
                + (", or map the tenant's cache salts in its own engines only"
                   if tenant is not None else "")) from e
        except KvtierError as e:
            self._drop_idle_client()
            if name not in self._attach_warned:
                log.warning("kvtier: attach to %r failed (%s); retrying every "
                            "%.0f s", name, e, self.config.retry_s)
                self._attach_warned.add(name)
            return None
        self._ns[name] = ns
        if self._warned or name in self._attach_warned:
            log.warning("kvtier: daemon reachable again, namespace %r attached",
                        name)
        else:
            log.info("kvtier: %s attached namespace %r (%d-byte rows)",
                     self.role, name, self.layout.page_banks[0].row_bytes)
        self._warned = False
        self._attach_warned.discard(name)
        if self._warn_open and not ns.acl_entry:
            self._say_open(name)
        if self._on_attach is not None:
            self._on_attach(ns)
        return ns

    def _connect(self) -> Client | None:
        """The link's client, connecting first; None (warned once per
        outage) while the daemon cannot be reached."""
        if self._client is not None:
            return self._client
        try:
            self._client = Client(socket=self.config.socket,
                                  name=f"{self.config.client_name}-{self.role}",
                                  timeout_ms=self.timeout_ms, instance=self.instance)
        except KvtierError as e:
            if not self._warned:
                log.warning("kvtier: no daemon at %s (%s); serving without "
                            "the host tier, retrying every %.0f s",
                            self.config.socket or "the default socket", e,
                            self.config.retry_s)
                self._warned = True
            return None
        return self._client

    def _drop_idle_client(self) -> None:
        """Closes the client when no namespace is attached through it (a
        failed first attach holds no session open meanwhile)."""
        if self._client is not None and not self._ns:
            self._client.close()
            self._client = None

    def _say_open(self, name: str) -> None:
        tenant = self.tenants.tenant_of(name)
        if tenant is None:
            log.warning(
                "kvtier: namespace %r is governed by no --namespace_acl entry: "
                "every engine that reaches kvtierd may attach it, map its rows "
                "read-write and commit any bytes under any hash, so all of them "
                "share one trust domain with this engine (the cache salt keeps "
                "tenants' lookups apart, not their memory). Tenants that must "
                "not share memory: %s, each with an ACL entry "
                "(docs/vllm.md, \"Tenants\")", name, TENANTS_KEY)
        else:
            log.warning(
                "kvtier: tenant %r's namespace %r is governed by no "
                "--namespace_acl entry: every engine that reaches kvtierd may "
                "attach it, so it keeps the tenant's KV from nobody; give "
                "kvtierd an entry such as '%s.*=group:GROUP' (GROUP: the "
                "tenant's engines' group)", tenant, name, tenant)

    def _page_rows(self) -> int:
        if not self.config.host_bytes:
            return 0
        row = sum(b.row_bytes for b in self.layout.page_banks)
        return max(1, self.config.host_bytes // row)

    def session_alive(self) -> bool:
        return self._client is not None and self._client.session_alive

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = None
        self._ns = {}
