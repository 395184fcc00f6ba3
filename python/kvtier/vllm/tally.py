"""What every rank of a parallel engine reported: a load or a store counts
only once each rank that takes part has finished it.

vLLM merges its workers' KVConnectorWorkerMetadata per step (the
connector's KvtierWorkerMetadata keeps one StepReport per rank), but ranks
finish a copy in different steps (CUDA events, PP stages). RankTally keeps
the acknowledgements across steps: a request's pin may go only once every
rank's copy out of its rows has finished; a store is announced (KV events)
only once every storing rank committed it, and one rank's failure makes
the scheduler store the request again from its first page.

Thread-safety: one thread at a time (the scheduler's).
"""

from __future__ import annotations

from collections.abc import Iterable

from .data import StepReport
from .layout import Ranks


class RankTally:
    """Acknowledgements of loads and stores by rank.

    Args:
      ranks: the engine's workers; loads wait for every rank, stores for
        the storing ones (Ranks.storing).
      ready: the namespaces the scheduler may report hits from until a rank
        said which it can copy for (the workers attach before vLLM builds
        the scheduler, so its own attach is the best first guess).

    Every rank reports each load and store it was sent, done or failed
    (worker.py), so an entry lives until the last rank's report; requests
    that finished meanwhile need nothing dropped.
    """

    def __init__(self, ranks: Ranks, ready: Iterable[str] = ()):
        self.ranks = ranks
        self._first_ready = frozenset(ready)
        self._attached: dict[int, frozenset[str]] = {}
        self._loads: dict[str, set[int]] = {}  # req_id -> ranks done
        # (req_id, first page) -> [pages, ranks that reported, some failed]
        self._stores: dict[tuple[str, int], list] = {}

    def set_first_ready(self, ready: Iterable[str]) -> None:
        self._first_ready = frozenset(ready)

    @property
    def ready(self) -> set[str]:
        """The namespaces every rank can copy for."""
        out = None
        for r in range(self.ranks.world):
            names = self._attached.get(r, self._first_ready)
            out = set(names) if out is None else out & names
        return out or set()

    def add(self, report: StepReport):
        """Takes one rank's report. Returns (loads finished on every rank,
        requests whose store failed on some rank, (req_id, first, n) of
        stores every storing rank committed)."""
        rank = report.rank
        if not 0 <= rank < self.ranks.world:
            raise ValueError(f"a step report of rank {rank}, outside the "
                             f"engine's {self.ranks.world}")
        self._attached[rank] = frozenset(report.attached or ())
        loads_done = []
        for req_id in report.loaded | report.failed_loads:
            done = self._loads.setdefault(req_id, set())
            done.add(rank)
            if len(done) == self.ranks.world:
                loads_done.append(req_id)
                del self._loads[req_id]
        failed: set[str] = set()
        stored = []
        storing = self.ranks.storing
        if rank in storing:
            outcomes = [(key, False, 0) for key in report.failed_stores]
            outcomes += [((req_id, first), True, n) for req_id, first, n in report.stored]
            for key, ok, n in outcomes:
                entry = self._stores.setdefault(key, [n, set(), False])
                entry[1].add(rank)
                if not ok and not entry[2]:
                    entry[2] = True
                    failed.add(key[0])  # at once: the chain may be broken
                if entry[1] >= storing:
                    if not entry[2]:
                        stored.append((key[0], key[1], entry[0]))
                    del self._stores[key]
        return loads_done, failed, stored

    @property
    def pending(self) -> int:
        """Loads and stores some rank has not reported yet."""
        return len(self._loads) + len(self._stores)
