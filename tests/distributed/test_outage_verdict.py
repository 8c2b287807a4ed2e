"""worker/outages.py's parts: which errors are storage outages (anywhere in the chain), the backoff,
the verdict past FREIGHT_MAX_SHARD_STORAGE_OUTAGES, and the Redis count (the attempt's own strike taken
back, never another's, never below zero; a resubmit clears it). test_storage_outage.py runs them in a real worker."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from celery.exceptions import Reject

from jobs.errors import BucketNotFoundError, StorageError, StorageUnavailableError
from jobs.live_state import LiveState
from jobs.settings import Settings
from worker.outages import finalize_outage, outage_backoff_s, outage_verdict, storage_outage
from worker.strike import Strike


def _wrapped(inner: BaseException, *, implicit: bool) -> RuntimeError:
    try:
        try:
            raise inner
        except BaseException as exc:
            if implicit:
                raise RuntimeError("writing the result failed")  # noqa: B904 - __context__ only
            raise RuntimeError("writing the result failed") from exc
    except RuntimeError as outer:
        return outer


def test_an_outage_is_found_anywhere_in_the_chain() -> None:
    busy = StorageUnavailableError("S3 answered SlowDown")
    assert storage_outage(busy) is busy
    assert storage_outage(_wrapped(busy, implicit=False)) is busy  # raise ... from
    assert storage_outage(_wrapped(busy, implicit=True)) is busy  # raised while handling it
    assert storage_outage(_wrapped(_wrapped(busy, implicit=False), implicit=True)) is busy
    # storage answered (no bucket, access denied), or no storage at all: the shard's strike stands
    for other in (BucketNotFoundError("gone"), StorageError("AccessDenied"), ValueError("bad row")):
        assert storage_outage(_wrapped(other, implicit=False)) is None
    loop = RuntimeError("a")
    loop.__context__ = RuntimeError("b")
    loop.__context__.__context__ = loop  # a cycle must end
    assert storage_outage(loop) is None


def test_the_backoff_grows_to_its_cap_and_the_verdict_comes_at_the_budget() -> None:
    s = Settings()
    assert (s.max_shard_storage_outages, s.storage_outage_backoff_cap_s) == (20, 300.0)
    assert [outage_backoff_s(s, n) for n in (1, 2, 3, 8, 9, 20, 10_000)] == [2, 4, 8, 256, 300, 300, 300]
    exc = StorageUnavailableError("cannot reach http://s3.example")
    assert outage_verdict(4, 5, exc) is None
    verdict = outage_verdict(5, 5, exc)
    assert verdict is not None and verdict.startswith("storage was unavailable for 5 attempts")
    assert "cannot reach http://s3.example" in verdict and "freight submit" in verdict
    spent = outage_verdict(5, 5, None)  # found spent before an attempt runs: no last error to name
    assert spent is not None and "the last" not in spent and "FREIGHT_MAX_SHARD_STORAGE_OUTAGES=5" in spent


@pytest.fixture()
def live(redis_url: str) -> Iterator[LiveState]:
    state = LiveState(redis_url)
    yield state
    state.close()


def test_an_outage_takes_the_strike_back_and_counts_itself(live: LiveState) -> None:
    assert live.begin_attempt("j", 0) == (1, 1)
    assert live.count_storage_outage("j", 0, holds_strike=True) == 1
    assert live.begin_attempt("j", 0) == (2, 1)  # the outage left no strike
    live.end_attempt_clean("j", 0)  # ended cleanly, then a storage call failed: no strike left to take
    assert live.count_storage_outage("j", 0, holds_strike=False) == 2
    assert live.begin_attempt("j", 0) == (3, 1)
    live.end_attempt_clean("j", 0)
    assert live.count_storage_outage("j", 0, holds_strike=True) == 3  # a stray one: never below zero
    assert live.begin_attempt("j", 0) == (4, 1)
    assert live.storage_outages("j", 0) == 3 and live.storage_outages("j", 1) == 0
    live.reset_strikes("j")  # a resubmit: a fresh budget
    assert live.storage_outages("j", 0) == 0


def test_an_outage_after_a_clean_end_keeps_an_earlier_crash_strike(live: LiveState) -> None:
    """Attempt 1 crashes (its strike stays); attempt 2 ends cleanly (handed back), then deleting a
    stale record meets a storage outage. The outage must not take back attempt 1's strike: a shard
    that crashes, meets an outage, and crashes again would otherwise never fail."""
    assert live.begin_attempt("j", 0) == (1, 1)  # crashes: never ends
    _, strikes = live.begin_attempt("j", 0)
    strike = Strike(live, "j", 0, strikes)
    assert (strike.count, strike.unclean) == (2, 2)
    strike.release()
    strike.release()  # once only
    assert strike.unclean == 1 and strike.to_outage() == 1
    assert live.begin_attempt("j", 0) == (3, 2)  # the crash still counts
    # an attempt that still holds its strike gives back its own, and only that
    strike = Strike(live, "j", 0, 2)
    assert strike.to_outage() == 2 and not strike.held
    assert live.begin_attempt("j", 0) == (4, 2)


def test_finalize_outages_requeue_until_the_budget_then_give_up(live: LiveState) -> None:
    rt = SimpleNamespace(live=live, settings=Settings(max_shard_storage_outages=2, storage_outage_backoff_cap_s=0.01),
                         stopping=lambda: False)  # fmt: skip
    assert finalize_outage(rt, Strike(live, "j", -1, 1), ValueError("a bug")) is False  # the strike rules apply
    _, strikes = live.begin_attempt("j", -1)
    with pytest.raises(Reject):
        finalize_outage(rt, Strike(live, "j", -1, strikes), _wrapped(StorageUnavailableError("503"), implicit=True))
    _, strikes = live.begin_attempt("j", -1)
    assert finalize_outage(rt, Strike(live, "j", -1, strikes), StorageUnavailableError("503")) is True  # spent
    assert live.storage_outages("j", -1) == 2
