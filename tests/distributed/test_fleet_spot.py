"""The spot watcher against a fake IMDSv2 server on loopback (real HTTP, real thread)."""

from __future__ import annotations

import threading

from fleet_servers import FakeImds, free_port

from worker.spot import ImdsClient, SpotWatcher


def test_no_notice_until_announced_then_one_callback(imds: FakeImds) -> None:
    seen = []
    fired = threading.Event()
    watcher = SpotWatcher(ImdsClient(imds.url), lambda n: (seen.append(n), fired.set()), poll_s=0.05).start()
    assert not fired.wait(0.3)
    assert watcher.notice is None
    imds.announce("terminate")
    assert fired.wait(5)
    watcher.join(5)
    assert len(seen) == 1 and seen[0].kind == "instance-action" and seen[0].action == "terminate"
    # IMDSv2: every GET carried a token obtained with a PUT first.
    assert imds.requests[0] == "PUT /latest/api/token"
    assert "GET /latest/meta-data/events/recommendations/rebalance" in imds.requests


def test_rebalance_recommendation_is_a_notice(imds: FakeImds) -> None:
    imds.recommend_rebalance()
    client = ImdsClient(imds.url)
    notice = client.notice()
    assert notice is not None and notice.kind == "rebalance" and notice.time == "2026-11-29T15:58:00Z"
    assert client.instance_id() == "i-0123456789abcdef0"


def test_expired_token_is_renewed(imds: FakeImds) -> None:
    client = ImdsClient(imds.url)
    assert client.notice() is None
    imds.TOKEN = "rotated"  # the server forgets the old token: a 401, then a new PUT
    imds.announce()
    assert client.notice() is not None
    assert sum(1 for r in imds.requests if r.startswith("PUT")) == 2


def test_watcher_gives_up_off_ec2() -> None:
    calls = []
    watcher = SpotWatcher(ImdsClient(f"http://127.0.0.1:{free_port()}", timeout_s=0.2), calls.append,
                          poll_s=0.01, give_up_after=3).start()  # fmt: skip
    watcher.join(5)
    assert not watcher._thread.is_alive() and calls == [] and watcher.notice is None
