"""Fleet recovery under chaos (bench/chaos.py with its defaults): one job on 3 real workers with
default settings while 20 of them are SIGKILLed, 5 get a spot notice from the fake IMDS, Redis
restarts once and its queue keys are flushed once. The job finishes on its own, every row exactly
once, equal to the undisturbed run; every killed shard is back on its queue within 2 minutes."""

from __future__ import annotations

import runpy
from collections import Counter
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_one_job_survives_kills_notices_a_redis_restart_and_a_flush() -> None:
    chaos = runpy.run_path(str(BENCH), run_name="chaos")
    report = chaos["run"](chaos["parser"]().parse_args([]))
    chaos["print_report"](report)
    assert Counter(e.kind for e in report.events) == {"kill": 20, "notice": 5, "redis_restart": 1, "flush": 1}
    assert report.rows_exactly_once and report.equal_to_undisturbed
    hit = [e for e in report.events if e.kind in ("kill", "notice") and e.shard is not None]
    assert sum(e.kind == "kill" for e in hit) >= 10  # most kills caught a shard mid-way
    for e in hit:  # (a kill between two shards, a notice after the last row, lose nothing)
        assert e.restarted_after_s is not None, e  # it ran again
        # back on its queue within 2 minutes (a restart proves it too: a duplicate message already
        # queued, e.g. by the reconciler after the flush, leaves no requeue line of its own)
        back = min(t for t in (e.requeued_after_s, e.restarted_after_s) if t is not None)
        assert back < 120, e
