"""When a shard fails for good: crashes in a live worker against FREIGHT_MAX_SHARD_ATTEMPTS, attempts
lost with their whole worker (the lease reaper restored them) against the larger
FREIGHT_MAX_SHARD_NODE_LOSSES. A chaos run's random machine losses land on one shard several times
in a row often enough (1 in 3 per kill with 3 workers) that counting them as crashes failed jobs."""

from __future__ import annotations

import pytest

from worker.outcomes import poison_verdict

MAX_CRASHES, MAX_NODE_LOSSES = 3, 10


@pytest.mark.parametrize(
    ("strikes", "node_losses", "fails"),
    [
        (1, 0, None),  # a first attempt
        (3, 0, None),  # two crashes before this attempt
        (4, 0, "3 attempts ended without a result"),  # three crashes: poison, as before
        (4, 3, None),  # three machines lost under it: run it again
        (7, 3, "3 attempts ended without a result"),  # three crashes besides three machine losses
        (10, 9, None),
        (11, 10, "10 attempts were lost with their worker"),  # the machine-loss budget ends it too
        (1, 2, None),  # restored before its attempt counted (died while taking it): never negative
    ],
)
def test_poison_verdict(strikes: int, node_losses: int, fails: str | None) -> None:
    verdict = poison_verdict(strikes, node_losses, MAX_CRASHES, MAX_NODE_LOSSES)
    if fails is None:
        assert verdict is None
    else:
        assert verdict is not None and verdict.startswith(fails) and "resubmit" in verdict
