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

Background attach (`background=True`, what the connector uses): a
namespace's attach (connect, Hello, Attach, which may populate banks: up
to libkvtier's Attach deadline) runs on a thread of the link's own, never
in the scheduler's or the worker's step; until it completes, namespace()
returns None (lookups miss, stores are skipped; the halves count both).
The result is installed, and `on_attach` run, on the caller's thread the
next time it asks. At start, attach_all(wait_s) waits a bounded time so
that a refusal (layout, ACL) still stops vLLM at start; a refusal found
later is logged as an error and the namespace stays off (never retried).

Thread-safety: one thread at a time calls the link (vLLM calls a connector
from one thread); its attach thread touches only the client (libkvtier's
Client is thread-safe), under `_lock` where it creates or closes it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
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
      tp_rank: the namespace rank this process attaches as (layout.Ranks:
        TP x PP workers; the scheduler is rank 0).
      background: attach on the link's own thread (see the module comment);
        False: namespace() attaches before it returns.
    """

    def __init__(self, config: ConnectorConfig, name: str, layout: Layout,
                 role: str, on_attach: Callable[[Namespace], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 timeout_ms: int | None = None, instance: bytes | None = None,
                 tenants: TenantMap | None = None, warn_open: bool = False,
                 tp_rank: int = 0, background: bool = False):
        self.config = config
        self.tp_rank = tp_rank
        self.background = background
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
        self._lock = threading.Lock()  # _client's creation and close
        self._closed = False
        self._attaches = 0  # namespaces attached through _client
        self._busy = 0  # attach jobs running on the attach thread
        self._connecting = threading.Lock()  # one _connect at a time
        self._inflight: dict[str, concurrent.futures.Future] = {}
        self._refused: set[str] = set()  # refused after start: off for good
        self._started = False  # attach_all returned: refusals no longer raise

    @property
    def attached(self) -> bool:
        """Whether the engine's namespace is attached."""
        return self.name in self._ns

    def attached_to(self, name: str) -> bool:
        return name in self._ns

    def attach_all(self, wait_s: float = 0.0) -> set[str]:
        """Attaches every namespace that is due; the names attached. In the
        background, waits up to `wait_s` for the attaches first. Raises
        AttachRefused as namespace() does, while starting."""
        names = {n for n in self.names if self.namespace(n) is not None}
        if self.background and wait_s > 0 and self._inflight:
            concurrent.futures.wait(list(self._inflight.values()), timeout=wait_s)
            names = {n for n in self.names if self.namespace(n) is not None}
        self._started = True
        return names

    @property
    def attaching(self) -> bool:
        """Whether a background attach is under way."""
        return any(not f.done() for f in self._inflight.values())

    def namespace(self, name: str | None = None) -> Namespace | None:
        """Namespace `name` (default: the engine's), attaching first if due
        (in the background: starting the attach); None while the daemon
        cannot be reached or has not attached it yet. Raises LayoutRefused
        when the daemon rejects the layout, and AttachRefused when its ACL
        does not allow this engine (never retried: the configuration is
        wrong); in the background only until attach_all returned, later
        a refusal is logged and the namespace stays None."""
        name = name or self.name
        ns = self._ns.get(name)
        if ns is not None:
            return ns
        if name not in self.names:
            raise KeyError(f"kvtier: namespace {name!r} is not one of this "
                           f"engine's ({', '.join(self.names)})")
        if name in self._refused or self._closed:
            return None
        if name in self._inflight:
            return self._harvest(name)
        now = self._clock()
        if now < self._next_try.get(name, 0.0):
            return None
        self._next_try[name] = now + self.config.retry_s
        if not self.background:
            ns = self._attach_now(name)
            return self._install(name, ns) if ns is not None else None
        # A daemon thread, not an executor's: a daemon that stalls must not
        # hold the engine's exit for an Attach deadline.
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run():
            try:
                future.set_result(self._attach_job(name))
            except BaseException as e:  # handed to _harvest
                future.set_exception(e)
        self._inflight[name] = future
        threading.Thread(target=run, name=f"kvtier-attach-{self.role}",
                         daemon=True).start()
        return None

    def _attach_job(self, name: str) -> Namespace | None:
        """_attach_now on the attach thread; the last one out of a closed
        link closes its client."""
        with self._lock:
            self._busy += 1
        try:
            return self._attach_now(name)
        finally:
            with self._lock:
                self._busy -= 1
                if self._closed and self._busy == 0:
                    self._close_client()

    def _harvest(self, name: str) -> Namespace | None:
        """The outcome of namespace `name`'s background attach, if it is
        over: installed, or a refusal raised (starting) or logged."""
        future = self._inflight[name]
        if not future.done():
            return None
        del self._inflight[name]
        try:
            ns = future.result()
        except AttachRefused as e:
            if not self._started:
                raise
            self._refused.add(name)
            log.error("%s; the engine serves without this namespace", e)
            return None
        return self._install(name, ns) if ns is not None else None

    def _attach_now(self, name: str) -> Namespace | None:
        """Connects and attaches `name` (on the caller's or the attach
        thread); None (warned once) when the daemon cannot do it now."""
        client = self._connect()
        if client is None:
            return None
        try:
            ns = client.attach(name, self.layout, tp_rank=self.tp_rank,
                               page_rows=self._page_rows(),
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
        with self._lock:
            if self._closed:  # closed meanwhile: nothing is installed
                return None
            self._attaches += 1
        return ns

    def _install(self, name: str, ns: Namespace) -> Namespace:
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
        with self._connecting:
            return self._connect_locked()

    def _connect_locked(self) -> Client | None:
        if self._client is not None:
            return self._client
        try:
            client = Client(socket=self.config.socket,
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
        with self._lock:
            if self._closed:
                client.close()
                return None
            self._client = client
        return client

    def _drop_idle_client(self) -> None:
        """Closes the client when no namespace was attached through it (a
        failed first attach holds no session open meanwhile)."""
        with self._lock:
            if self._attaches == 0:
                self._close_client()

    def _close_client(self) -> None:
        """REQUIRES: _lock held."""
        if self._client is not None:
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
        """Closes the client, and with it every namespace; an attach still
        under way closes it when it returns."""
        with self._lock:
            self._closed = True
            if self._busy == 0:
                self._close_client()
        self._ns = {}
