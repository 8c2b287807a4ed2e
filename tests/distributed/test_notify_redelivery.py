"""Notifications are delivered at least once: a claimer killed (kill -9) mid-delivery leaves its claim,
and the reconcile pass sends it again, once, with the same delivery id and body bytes; a delivered
claim is never sent again; reconcilers racing send once; a target that never answers is given up
after FREIGHT_NOTIFY_REDELIVERIES, recorded; a job that ended with no claim at all (its claimer died
first) is claimed and sent by the pass. A real loopback receiver, a private redis-server."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleet_jobs import REPO, make_input
from webhook_receiver import WebhookReceiver

from jobs.client import FleetClient
from jobs.live_state import LiveState
from jobs.notify import notifier, notify_final
from jobs.planner import prepare_job
from jobs.progress import aux_key
from jobs.reconcile import Reconciler
from jobs.settings import Settings
from jobs.spec import JobSpec
from jobs.storage import open_store

SECRET = "redelivery-secret"
CLAIMER = """
import sys, time
from jobs.manifest import read_manifest
from jobs.notify import notify_final
from jobs.settings import Settings
from jobs.storage import open_store
settings = Settings()
store = open_store(sys.argv[1], settings)
assert notify_final(store, read_manifest(store), "failed", None, settings)
time.sleep(120)  # the delivery hangs on the receiver; the test kills this process first
"""


def _failed_job(tmp_path: Path, model: Path, redis_url: str, target: str, state: str = "failed") -> tuple[Path, str]:
    """A job that Redis knows as ended (`state`), whose submission asked to notify `target`."""
    from jobs.lifecycle import Lifecycle, write_lifecycle

    out = tmp_path / "out"
    spec = JobSpec(input=str(make_input(tmp_path / "in.parquet", 4)), model=str(model), output=str(out))
    prepared = prepare_job(spec)
    write_lifecycle(prepared.store, Lifecycle(notify=(target,)))
    live = LiveState(redis_url)
    live.init_job(spec.job_id, output=str(out), queue="q", model=str(model), est_tokens={0: 1})
    if state == "cancelled":
        live.request_cancel(spec.job_id)
    else:
        live.set_job_state(spec.job_id, state)
    live.close()
    return out, spec.job_id


MakeReceiver = Callable[..., WebhookReceiver]
MakeClient = Callable[[Settings], FleetClient]


@pytest.fixture
def receiver() -> Iterator[MakeReceiver]:
    """make(**kwargs) -> a WebhookReceiver, closed at the end of the test."""
    made: list[WebhookReceiver] = []

    def make(**kwargs: int) -> WebhookReceiver:
        made.append(WebhookReceiver(**kwargs))
        return made[-1]

    yield make
    for rx in made:
        rx.close()


@pytest.fixture
def fleet_client() -> Iterator[MakeClient]:
    """make(settings) -> a FleetClient, closed at the end of the test (before the receivers)."""
    made: list[FleetClient] = []

    def make(settings: Settings) -> FleetClient:
        made.append(FleetClient(settings))
        return made[-1]

    yield make
    for client in made:
        client.close()


def _settings(redis_url: str, **extra: object) -> Settings:
    return Settings(redis_url=redis_url, webhook_secret=SECRET, notify_backoff_s=0.05, **extra)  # type: ignore[arg-type]


def _markers(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "notify").rglob("*.json") if p.parent != out / "notify")



def _race(clients: list[FleetClient], racers: list[Settings], now: float | None) -> None:
    """Reconcile passes of several workers at once (a barrier lines them up), at `now` (None: real time)."""
    barrier = threading.Barrier(len(racers))

    def race(i: int) -> None:
        barrier.wait()
        Reconciler(clients[i], racers[i]).run(now)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(racers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_a_claimer_killed_mid_delivery_is_redelivered_once_with_the_same_delivery_id(
    redis_url: str, tmp_path: Path, demo_model: Path, receiver: MakeReceiver, fleet_client: MakeClient
) -> None:
    rx = receiver(hold=1)
    out, job_id = _failed_job(tmp_path, demo_model, redis_url, rx.url)
    env = {**os.environ, "PYTHONPATH": str(REPO), "FREIGHT_WEBHOOK_SECRET": SECRET, "FREIGHT_NOTIFY_TIMEOUT_S": "60"}
    claimer = subprocess.Popen([sys.executable, "-c", CLAIMER, str(out)], cwd=REPO, env=env)
    try:
        (held,) = rx.wait(1, delivered=False, timeout=60)  # the POST is in flight, unanswered
    finally:
        os.kill(claimer.pid, signal.SIGKILL)
        claimer.wait()
    rx.release()
    claim = json.loads((out / "notify" / "failed.json").read_text())
    assert claim["delivery_id"] == held.delivery_id == held.json()["delivery_id"]
    assert claim["claimed_by"].endswith(f"/{claimer.pid}") and claim["targets"] == [rx.url]
    assert _markers(out) == []  # nothing says delivered: at-most-once would end here

    settings = _settings(redis_url)
    client = fleet_client(settings)
    reconciler = Reconciler(client, settings)
    reconciler.run(time.time() + 1)  # within the grace: the claimer may still be sending
    time.sleep(0.3)
    assert rx.delivered() == [] and _markers(out) == []
    now = time.time() + settings.notify_redeliver_grace_s + 1
    reconciler.run(now)
    (post,) = rx.wait(1)
    assert post.delivery_id == held.delivery_id and post.body == held.body  # the same bytes
    expected = "sha256=" + hmac.new(SECRET.encode(), post.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(post.headers["X-Freight-Signature"], expected)
    assert notifier(settings).drain(10)
    assert _markers(out) == ["delivered.json", "try-1.json"]
    # delivered: later passes send nothing, and the job is settled (storage not read again)
    reconciler.run(now + 1000 * settings.notify_redeliver_grace_s)
    reconciler.run(now + 2000 * settings.notify_redeliver_grace_s)
    time.sleep(0.3)
    assert len(rx.posts) == 2 and len(rx.delivered()) == 1
    assert client.live.client.exists(aux_key("notified", job_id))


def test_reconcilers_racing_redeliver_once(
    redis_url: str, tmp_path: Path, demo_model: Path, receiver: MakeReceiver, fleet_client: MakeClient
) -> None:
    rx = receiver(fail=1)  # the claimer's only try gets a 503
    out, _ = _failed_job(tmp_path, demo_model, redis_url, rx.url)
    first = _settings(redis_url, notify_attempts=1)
    store = open_store(str(out), first)
    from jobs.manifest import read_manifest

    assert notify_final(store, read_manifest(store), "failed", None, first)
    assert notifier(first).drain(10) and [p.status for p in rx.posts] == [503]
    now = time.time() + first.notify_redeliver_grace_s + 1
    racers = [_settings(redis_url) for _ in range(4)]  # each its own client, sender and store
    clients = [fleet_client(s) for s in racers]
    _race(clients, racers, now)
    (post,) = rx.wait(1)
    assert all(notifier(s).drain(10) for s in racers)
    time.sleep(0.3)
    assert len(rx.delivered()) == 1 and len(rx.posts) == 2
    assert post.delivery_id == rx.posts[0].delivery_id
    assert _markers(out) == ["delivered.json", "try-1.json"]


def test_a_target_that_never_answers_is_given_up_and_recorded(
    redis_url: str, tmp_path: Path, demo_model: Path, receiver: MakeReceiver, fleet_client: MakeClient
) -> None:
    rx = receiver(fail=1000)
    out, job_id = _failed_job(tmp_path, demo_model, redis_url, rx.url)
    settings = _settings(redis_url, notify_attempts=1, notify_redeliveries=2)
    store = open_store(str(out), settings)
    from jobs.manifest import read_manifest

    assert notify_final(store, read_manifest(store), "failed", None, settings)
    assert notifier(settings).drain(10)
    grace = settings.notify_redeliver_grace_s
    client = fleet_client(settings)
    reconciler = Reconciler(client, settings)
    last = json.loads((out / "notify" / "failed.json").read_text())["claimed_at"]  # try 0 began
    for wait in (grace, 2 * grace, 4 * grace):  # after try n, the next waits grace x 2^n
        reconciler.run(last + wait - 1)  # not yet due: nothing
        assert notifier(settings).drain(10)
        last += wait + 0.5
        reconciler.run(last)
        assert notifier(settings).drain(10)
    now = last
    time.sleep(0.3)
    assert [p.status for p in rx.posts] == [503, 503, 503]  # the claim's try and 2 redeliveries
    assert len({p.delivery_id for p in rx.posts}) == 1
    given_up = list((out / "notify").rglob("given-up.json"))
    assert len(given_up) == 1 and json.loads(given_up[0].read_text())["tries"] == 3
    assert client.live.client.exists(aux_key("notified", job_id))
    reconciler.run(now + 100 * grace)
    time.sleep(0.3)
    assert len(rx.posts) == 3


def test_a_job_that_ended_without_a_claim_is_claimed_and_sent_by_the_pass(
    redis_url: str, tmp_path: Path, demo_model: Path, receiver: MakeReceiver, fleet_client: MakeClient
) -> None:
    """What `freight cancel` leaves when it is killed after _CANCELLED and the Redis flag, before its
    claim: the pass claims and sends the "cancelled" notification, once among racing reconcilers."""
    from jobs.markers import write_cancel

    rx = receiver()
    out, job_id = _failed_job(tmp_path, demo_model, redis_url, rx.url, state="cancelled")
    assert write_cancel(open_store(str(out), Settings()), job_id)
    assert not (out / "notify").exists()
    # real time here (the claim is stamped with it): a grace of 1.5 s, passed before the race
    racers = [_settings(redis_url, notify_redeliver_grace_s=1.5) for _ in range(3)]
    clients = [fleet_client(s) for s in racers]
    time.sleep(1.6)
    _race(clients, racers, None)
    (post,) = rx.wait(1)
    assert all(notifier(s).drain(10) for s in racers)
    time.sleep(0.3)
    assert len(rx.posts) == 1
    body = post.json()
    claim = json.loads((out / "notify" / "cancelled.json").read_text())
    assert body["state"] == "cancelled" and body["job_id"] == job_id and body["rows_total"] == 4
    assert post.delivery_id == body["delivery_id"] == claim["delivery_id"]
    assert _markers(out) == ["delivered.json"]
    Reconciler(clients[0], racers[0]).run(time.time() + 1000)  # settled: nothing more
    time.sleep(0.3)
    assert len(rx.posts) == 1 and clients[0].live.client.exists(aux_key("notified", job_id))


@pytest.mark.slow
def test_a_worker_killed_mid_delivery_is_made_good_by_the_next_workers_pass(
    redis_url: str, tmp_path: Path, demo_model: Path, receiver: MakeReceiver
) -> None:
    """End to end: the worker that finalizes a job is SIGKILLed (main and pool process: a lost spot
    machine) while its POST is on the wire; the next worker's own reconcile pass redelivers it, with
    the same delivery id. FREIGHT_NOTIFY_REDELIVER_GRACE_S is shortened to 1 s (default 120 s)."""
    from fleet_jobs import Fleet, freight

    rx = receiver(hold=1)
    fleet = Fleet(redis_url, tmp_path, demo_model, overrides={"FREIGHT_NOTIFY_REDELIVER_GRACE_S": "1",
                                                              "FREIGHT_WEBHOOK_SECRET": SECRET})  # fmt: skip
    try:
        out = tmp_path / "out"
        proc = freight(["submit", str(make_input(tmp_path / "in.parquet", 4)), "--model", str(demo_model),
                        "--output", str(out), "--shard-rows", "2", "--max-tokens", "2", "--notify", rx.url],
                       fleet.env())  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        first = fleet.start("a")
        (held,) = rx.wait(1, delivered=False, timeout=180)  # finalized; the POST is unanswered
        first.kill_all()
        rx.release()
        assert (out / "_SUCCESS").exists() and not list(out.rglob("delivered.json"))
        fleet.start("b")
        (post,) = rx.wait(1, timeout=180)
        assert post.delivery_id == held.delivery_id and post.body == held.body
        expected = "sha256=" + hmac.new(SECRET.encode(), post.body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(post.headers["X-Freight-Signature"], expected)
        end = time.monotonic() + 30
        while not list(out.rglob("delivered.json")) and time.monotonic() < end:
            time.sleep(0.1)
        assert _markers(out) == ["delivered.json", "try-1.json"] and len(rx.delivered()) == 1
    finally:
        fleet.stop()
