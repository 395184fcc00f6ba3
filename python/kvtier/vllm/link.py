"""The connector's line to kvtierd: connect and attach lazily, retry a daemon
that is down every `retry_s` seconds, warn once per outage.

Both halves of the connector (scheduler and worker) hold one TierLink. A
daemon that is not running when vLLM starts is not an error: namespace()
returns None (the connector then reports misses and stores nothing) and the
link tries again later. Once attached, libkvtier reconnects by itself after
a daemon restart (lookups are misses meanwhile, reserves fail UNAVAILABLE).

Thread-safety: one thread at a time (vLLM calls a connector from one thread).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..client import Client, Layout, Namespace
from ..errors import InvalidArgumentError, KvtierError, FailedPreconditionError
from .config import ConnectorConfig

log = logging.getLogger("kvtier.vllm")


class LayoutRefused(RuntimeError):
    """The daemon refused this engine's layout for the namespace (another
    layout under the same name): a configuration error, raised at start."""


class TierLink:
    """Owns a Client and the attached Namespace.

    Args:
      config: the connector configuration (socket, timeout, retry interval).
      name: the namespace name.
      layout: the namespace layout.
      tp_rank: this engine's TP rank.
      role: "scheduler" or "worker", in the client name and the log.
      timeout_ms: the deadline of each daemon call (Attach, which may
        populate banks, always gets libkvtier's longer one).
      on_attach: called with the Namespace after each successful attach.
      clock: time source (seconds), for tests.
      instance: 16 bytes shared by the engine's processes (the fence
        protocol: the daemon keeps rows the scheduler leased while the
        worker may still read them, across daemon restarts); None: this
        process alone.
    """

    def __init__(self, config: ConnectorConfig, name: str, layout: Layout,
                 role: str, on_attach: Callable[[Namespace], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 timeout_ms: int | None = None, instance: bytes | None = None):
        self.config = config
        self.instance = instance
        self.name = name
        self.layout = layout
        self.role = role
        self._on_attach = on_attach
        self.timeout_ms = timeout_ms or config.timeout_ms
        self._clock = clock
        self._client: Client | None = None
        self._ns: Namespace | None = None
        self._next_try = 0.0
        self._warned = False

    @property
    def attached(self) -> bool:
        return self._ns is not None

    def namespace(self) -> Namespace | None:
        """The attached namespace, attaching first if due; None while the
        daemon cannot be reached. Raises LayoutRefused when the daemon
        rejects the layout (never retried: the configuration is wrong)."""
        if self._ns is not None:
            return self._ns
        now = self._clock()
        if now < self._next_try:
            return None
        self._next_try = now + self.config.retry_s
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
        try:
            ns = client.attach(self.name, self.layout,
                               page_rows=self._page_rows(),
                               snapshot_rows=self.config.snapshot_rows)
        except (InvalidArgumentError, FailedPreconditionError) as e:
            client.close()
            raise LayoutRefused(
                f"kvtier: namespace {self.name!r} refused this engine's layout "
                f"({e}); set kv_connector_extra_config['namespace'] to another "
                f"name or drop the namespace") from e
        except KvtierError as e:
            client.close()
            if not self._warned:
                log.warning("kvtier: attach to %r failed (%s); retrying every "
                            "%.0f s", self.name, e, self.config.retry_s)
                self._warned = True
            return None
        self._client, self._ns = client, ns
        if self._warned:
            log.warning("kvtier: daemon reachable again, namespace %r attached",
                        self.name)
        else:
            log.info("kvtier: %s attached namespace %r (%d-byte rows)",
                     self.role, self.name, self.layout.page_banks[0].row_bytes)
        self._warned = False
        if self._on_attach is not None:
            self._on_attach(ns)
        return ns

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
        self._client = self._ns = None
