"""Counters the connector reports through vLLM's get_kv_connector_stats.

Thread-safety: one thread at a time, like the halves that own them.
"""

import dataclasses


class Counters:
    """A dataclass mixin: take() returns the counters and zeroes them (one
    logging interval's worth)."""

    def take(self) -> dict:
        out = dataclasses.asdict(self)
        for f in dataclasses.fields(self):
            setattr(self, f.name, f.default)
        return out
