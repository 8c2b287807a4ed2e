"""Notifications when a job reaches a final state: webhooks (signed JSON POST) and SNS topics.

At least once per final state, with a delivery id that stays the same across redeliveries, so a
receiver dedupes on it. Whoever ends the job (finalize, the failures manifest, `freight cancel`, the
expiry) calls `notify_final`, which claims `OUT/notify/<state>.json` with put_if_absent before it
sends; a second finalizer (a redelivered finalize after a worker crash, two workers racing) finds
the claim and sends nothing. The claim records the delivery id (new per claim, so a resubmitted
job's next end has its own), when and by whom it was made, the targets and the payload. Delivery
runs on a daemon thread with retries and backoff, so neither a slow nor a dead receiver delays the
job; each target that answers 2xx is recorded under `OUT/notify/<state>/<delivery id>/` (see
jobs/notify_claims.py). A claimer that dies before that (kill -9, spot loss) leaves its claim
undelivered: the reconcile pass that runs in the workers redelivers it (jobs/redelivery.py), after
FREIGHT_NOTIFY_REDELIVER_GRACE_S, up to FREIGHT_NOTIFY_REDELIVERIES times, then records that it gave
up; a claimer that dies before claiming leaves no claim, and the same pass claims for it. Without a
fleet, `freight run` of the complete job again redelivers once. `drain(timeout)` lets a short-lived
process (`freight run`, `freight cancel`) give pending deliveries a bounded time before it exits.

Webhook body (JSON, UTF-8, the same bytes on every redelivery): delivery_id, job_id, state, rows,
rows_total, rows_failed, cost_usd, output, results, finished_at. Headers `X-Freight-Delivery:
<delivery id>` and `X-Freight-Signature: sha256=<hex HMAC-SHA256 of the body bytes>` keyed with
FREIGHT_WEBHOOK_SECRET (absent secret: sent unsigned, with a warning in the log). SNS: the same JSON
as the message, subject "freight job <id> <state>", message attribute `delivery_id`.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import itertools
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from jobs.lifecycle import read_lifecycle
from jobs.log import get_logger
from jobs.manifest import Manifest
from jobs.notify_claims import Claim, claim_key, clear_claim, mark_delivered, sender_id
from jobs.notify_targets import open_target, shown_target
from jobs.settings import Settings
from jobs.storage import ObjectStore
from jobs.webhook_address import Resolver, system_resolver
from jobs.webhook_post import post_webhook

log = get_logger(__name__)

FINAL_STATES = ("succeeded", "failed", "cancelled", "expired")
SIGNATURE_HEADER = "X-Freight-Signature"
DELIVERY_HEADER = "X-Freight-Delivery"


def sign(body: bytes, secret: str) -> str:
    """The signature header's value: "sha256=" + hex HMAC-SHA256 of `body` keyed with `secret`."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def payload(
    manifest: Manifest, state: str, report: dict[str, Any] | None, output: str, delivery_id: str
) -> dict[str, Any]:
    """The notification's JSON: what ended, how many rows, what it cost, where the results are."""
    report = report or {}
    return {
        "delivery_id": delivery_id,
        "job_id": manifest.job_id,
        "state": state,
        "rows": int(report.get("rows", 0)),
        "rows_total": manifest.input.rows,
        "rows_failed": int(report.get("rows_failed", 0)),
        "cost_usd": float(report.get("cost_usd", 0.0)),
        "output": output,
        "results": output.rstrip("/") + "/shards/",
        "finished_at": time.time(),
    }


@dataclass
class _Delivery:
    target: str  # as stored (jobs/notify_targets.py): a sealed webhook URL is opened at send
    body: bytes
    subject: str
    delivery_id: str | None = None
    on_delivered: Callable[[], None] | None = None  # called on a sender thread after a 2xx
    tries: int = 0
    not_before: float = field(default_factory=time.monotonic)


class Notifier:
    """A background sender: deliveries retried with exponential backoff, never on the caller's thread.

    A scheduler thread hands each due try to a pool of FREIGHT_NOTIFY_CONCURRENCY sender threads, so
    receivers are sent to concurrently: a slow one holds one sender for at most its try's deadline
    (FREIGHT_NOTIFY_TIMEOUT_S) and delays no other delivery while senders are free."""

    def __init__(self, settings: Settings, resolver: Resolver = system_resolver) -> None:
        self.settings = settings
        self.resolver = resolver
        self._due: list[tuple[float, int, _Delivery]] = []  # heap by not_before
        self._seq = itertools.count()
        self._pending = 0
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def send(
        self,
        target: str,
        body: bytes,
        subject: str,
        *,
        delivery_id: str | None = None,
        on_delivered: Callable[[], None] | None = None,
    ) -> None:
        """Queue one delivery (retried FREIGHT_NOTIFY_ATTEMPTS times); `on_delivered` runs after a 2xx."""
        with self._lock:
            self._pending += 1
            if self._thread is None or not self._thread.is_alive():
                self._pool = ThreadPoolExecutor(self.settings.notify_concurrency, thread_name_prefix="freight-notify")
                self._thread = threading.Thread(target=self._loop, name="freight-notify", daemon=True)
                self._thread.start()
            self._push(_Delivery(target, body, subject, delivery_id, on_delivered))

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` s for pending deliveries (delivered or given up); True if none is left."""
        end = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def _push(self, item: _Delivery) -> None:  # under self._lock
        heapq.heappush(self._due, (item.not_before, next(self._seq), item))
        self._lock.notify_all()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._due or self._due[0][0] > time.monotonic():
                    self._lock.wait(None if not self._due else self._due[0][0] - time.monotonic())
                item = heapq.heappop(self._due)[2]
            assert self._pool is not None
            self._pool.submit(self._try, item)

    def _try(self, item: _Delivery) -> None:
        item.tries += 1
        try:
            self._deliver(item)
            log.info("notify_sent", target=shown_target(item.target), tries=item.tries, delivery_id=item.delivery_id)
        except Exception as exc:  # any failure of a receiver is retried, then logged and dropped
            final = isinstance(exc, ValueError)  # a refused address or a sealed URL no key opens
            if not final and item.tries < self.settings.notify_attempts:
                item.not_before = time.monotonic() + min(60.0, self.settings.notify_backoff_s * 2 ** (item.tries - 1))
                with self._lock:
                    self._push(item)
                return
            log.error("notify_failed", target=shown_target(item.target), tries=item.tries, error=str(exc),
                      delivery_id=item.delivery_id, then="left to redelivery (jobs/redelivery.py)")  # fmt: skip
        else:
            self._record(item)
        with self._lock:
            self._pending -= 1
            self._lock.notify_all()

    @staticmethod
    def _record(item: _Delivery) -> None:
        if item.on_delivered is None:
            return
        try:
            item.on_delivered()
        except Exception as exc:  # storage away: the reconcile pass may send it again (same delivery id)
            log.warning("notify_record_failed", target=shown_target(item.target), error=str(exc))

    def _deliver(self, item: _Delivery) -> None:
        if item.target.startswith("sns:"):
            import boto3

            arn = item.target[4:]
            region = arn.split(":")[3]
            client = boto3.client("sns", region_name=region, endpoint_url=self.settings.sns_endpoint_url)
            extra: dict[str, Any] = {}
            if item.delivery_id:
                extra["MessageAttributes"] = {
                    "delivery_id": {"DataType": "String", "StringValue": item.delivery_id}
                }
            client.publish(TopicArn=arn, Message=item.body.decode(), Subject=item.subject[:100], **extra)
            return
        headers = {"Content-Type": "application/json", "User-Agent": "freight-notify/1"}
        if item.delivery_id:
            headers[DELIVERY_HEADER] = item.delivery_id
        secret = self.settings.webhook_secret.get_secret_value() if self.settings.webhook_secret else None
        if secret:
            headers[SIGNATURE_HEADER] = sign(item.body, secret)
        url = open_target(item.target, secret)
        post_webhook(url, item.body, headers, self.settings.notify_timeout_s,
                     self.settings.notify_allow_networks, self.resolver)  # fmt: skip


class _Senders:
    """This process's senders by settings. A forked child (a Celery pool process forked while the
    main process's reconcile pass redelivers) starts with none: the parent's sender thread is not in
    it, and a lock may have been held at the fork."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_settings: dict[int, Notifier] = {}

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]


_SENDERS = _Senders()
os.register_at_fork(after_in_child=_SENDERS.reset)


def notifier(settings: Settings) -> Notifier:
    """This process's sender for `settings` (one background thread per process and settings)."""
    with _SENDERS.lock:
        return _SENDERS.by_settings.setdefault(id(settings), Notifier(settings))


def notify_final(
    store: ObjectStore,
    manifest: Manifest,
    state: str,
    report: dict[str, Any] | None,
    settings: Settings,
) -> bool:
    """Claim `state`'s notification and send it (at least once: see the module docstring); True if
    this call claimed it, False when the job has no targets or another finalizer claimed it first."""
    if state not in FINAL_STATES:
        raise ValueError(f"unknown final state {state!r}; one of {FINAL_STATES}")
    lifecycle = read_lifecycle(store)
    if not lifecycle.notify:
        return False
    delivery_id = uuid.uuid4().hex
    body = payload(manifest, state, report, manifest.spec.output, delivery_id)
    claim = Claim(delivery_id, state, time.time(), sender_id(), tuple(lifecycle.notify), body)
    if not store.put_if_absent(claim_key(state), claim.to_json()):
        return False  # another finalizer claimed it
    if not settings.webhook_secret and any(not t.startswith("sns:") for t in lifecycle.notify):
        log.warning("webhook_unsigned", job_id=manifest.job_id, why="FREIGHT_WEBHOOK_SECRET is not set")
    for target in claim.targets:
        send_claim(store, claim, target, 0, settings)
    return True


def send_claim(store: ObjectStore, claim: Claim, target: str, n: int, settings: Settings) -> None:
    """Queue try `n` of `claim` to `target` on this process's sender; a 2xx is recorded in storage."""
    subject = f"freight job {claim.payload.get('job_id')} {claim.state}"
    notifier(settings).send(target, claim.body(), subject, delivery_id=claim.delivery_id,
                            on_delivered=lambda: mark_delivered(store, claim, target, n))  # fmt: skip


def clear_claims(store: ObjectStore) -> None:
    """A resubmit starts a new submission: its end (failed, cancelled, expired) gets a notification of
    its own. "succeeded" stays claimed: a job that succeeded never runs again."""
    for state in ("failed", "cancelled", "expired"):
        clear_claim(store, state)
