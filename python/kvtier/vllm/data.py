"""The data the connector's two halves pass each step, plain dataclasses
with no vLLM import: the scheduler (scheduler.py) builds LoadJob and
StoreJob, which travel to every worker inside the connector's
KvtierMetadata; each worker (worker.py) answers with a StepReport, which
travels back inside KvtierWorkerMetadata, one per rank, and is counted by
tally.py. vLLM moves both between processes, so they hold plain values
only (ints, bytes, strings and containers of them).

Thread-safety: LoadJob and StoreJob are immutable; a StepReport is filled
by one worker thread and then handed over.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LoadJob:
    """Copy rows[i] into vLLM block block_ids[i]; with a snapshot, the
    snapshot row into Mamba blocks snapshot_blocks (one per Mamba group,
    empty: none). `rows` and `snapshot_row`
    are rank 0's; with several ranks, `hashes` is the chain of pages
    [0, first_page + len(block_ids)), from which the other ranks find
    their own rows (see worker.py's module comment)."""
    req_id: str
    block_ids: tuple[int, ...]
    rows: tuple[int, ...]
    snapshot_blocks: tuple[int, ...] = ()
    snapshot_row: int | None = None
    namespace: str | None = None  # None: the engine's namespace
    first_page: int = 0
    hashes: tuple[bytes, ...] = ()
    # Per sliding-window group, its block of each page (0: not loaded, the
    # page is outside the window vLLM needs).
    group_blocks: tuple[tuple[int, ...], ...] = ()


@dataclasses.dataclass(frozen=True)
class StoreJob:
    """Store vLLM blocks block_ids (pages first_page.. of the request) under
    hashes, below `parent` (None: from the first page); with
    snapshot_blocks, the Mamba blocks (one per group) holding the state
    after the last page."""
    req_id: str
    first_page: int
    block_ids: tuple[int, ...]
    hashes: tuple[bytes, ...]
    parent: bytes | None = None
    snapshot_blocks: tuple[int, ...] = ()
    # The pages' token ids (config kv_event_tokens), for the daemon's KV
    # events; empty: none sent.
    token_ids: tuple[int, ...] = ()
    namespace: str | None = None  # None: the engine's namespace
    # Per sliding-window group, its block of each page (all live).
    group_blocks: tuple[tuple[int, ...], ...] = ()


@dataclasses.dataclass
class StepReport:
    """What the worker tells the scheduler after a step."""
    loaded: set[str] = dataclasses.field(default_factory=set)
    failed_loads: set[str] = dataclasses.field(default_factory=set)
    # (req_id, first_page, num_pages) of each committed store.
    stored: list[tuple[str, int, int]] = dataclasses.field(default_factory=list)
    # (req_id, first_page) of each store that failed.
    failed_stores: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    # The namespaces the worker can copy for (attached, with a transfer
    # engine): the scheduler reports no hits from the others.
    attached: frozenset[str] = frozenset()
    rank: int = 0  # the namespace rank of the worker that made it
