"""The strike one shard attempt takes at its start, and its way back.

LiveState.begin_attempt counts every attempt as a strike before anything can crash; the attempt takes
it back when it ends cleanly (committed, handed back, skipped, cancelled: `release`) or when it turns
out storage did not answer (worker/outages.py: an outage instead). The count in Redis is one number
per shard, shared by all its attempts, so an attempt must take back its own strike at most once: one
that released it and then met a storage error while finishing up (deleting a stale record, finalizing)
taking another would erase an earlier attempt's strike (a crash's), and a shard that kept crashing
between outages would never fail. `Strike` remembers whether this attempt still holds its strike.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.live_state import LiveState


@dataclass
class Strike:
    """This attempt's strike. `count`: the shard's strikes when it began, this one included."""

    live: LiveState
    job_id: str
    shard: int
    count: int
    held: bool = True

    @property
    def unclean(self) -> int:
        """The shard's attempts that have not ended cleanly as this attempt sees them: `count`, less
        this attempt's own strike once it was taken back."""
        return self.count if self.held else self.count - 1

    def release(self) -> None:
        """The attempt ended cleanly: take its strike back (once; a second call does nothing)."""
        if self.held:
            self.live.end_attempt_clean(self.job_id, self.shard)
            self.held = False

    def to_outage(self) -> int:
        """The attempt ended because storage did not answer: count an outage, and take the strike back
        if this attempt still holds it (never another attempt's). Returns the shard's outages.
        Raises redis.RedisError when Redis does not answer (the strike then stays as it was)."""
        outages = self.live.count_storage_outage(self.job_id, self.shard, holds_strike=self.held)
        self.held = False
        return outages
