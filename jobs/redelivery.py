"""Redelivery of notifications whose claimer died before a target answered (jobs/notify.py).

`redeliver_due(store, settings, now)` looks at one job's claims (jobs/notify_claims.py): a target
with neither a delivered nor a given-up record, whose latest try began at least
FREIGHT_NOTIFY_REDELIVER_GRACE_S x 2^n ago (n: redeliveries so far; try 0 is the claim itself), gets
redelivery n + 1: it is taken with put_if_absent (`try-<n+1>.json`), so of two reconcilers racing
exactly one sends, and sent on this process's background sender with the claim's delivery id and
body bytes; a 2xx records `delivered.json`. Once FREIGHT_NOTIFY_REDELIVERIES redeliveries have had
their wait, the target is given up: `given-up.json` and one `notify_given_up` error in the log.

`claim_missing(store, settings, state)` covers a claimer that died before its claim (a worker killed
between marking the job failed and claiming, `freight cancel` killed after `_CANCELLED`): when
storage confirms the final `state` Redis gives (`_SUCCESS`, a complete failures.json, `_CANCELLED`,
`_EXPIRED`), the job has notify targets and no claim for that state, it calls `notify_final` itself
(the claim's put_if_absent keeps it to one sender), with the report the claimer would have sent.

`NoticeSweep.run(states, now)` is the Redis side, run by the reconcile pass (jobs/reconcile.py) over
the finished jobs: a job finished at least the grace ago and not yet settled is looked at in
storage (claim_missing, then redeliver_due); once every claim of it is delivered or given up (or it
has none), `freight:notified:<job>` is set and the job is not read again (the key expires with the
job's others; a resubmit drops it). A job whose OUT holds no manifest any more is settled as is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jobs.errors import ObjectNotFoundError
from jobs.expiry import EXPIRED_KEY
from jobs.finalize import committed_shards, report_now
from jobs.lifecycle import read_lifecycle
from jobs.live_state import LiveState
from jobs.log import get_logger
from jobs.manifest import COST_KEY, SUCCESS_KEY, read_manifest
from jobs.markers import is_cancelled
from jobs.notify import notify_final, send_claim
from jobs.notify_claims import claim_key, claim_try, mark_given_up, read_claims, try_started_at
from jobs.notify_targets import shown_target
from jobs.progress import JOB_TTL_S, aux_key, job_key
from jobs.redact import redact
from jobs.settings import Settings
from jobs.status import finished_state
from jobs.storage import ObjectStore, open_store

log = get_logger(__name__)


def claim_missing(store: ObjectStore, settings: Settings, state: str) -> bool:
    """Claim and send `state`'s notification when its claimer died before claiming (see the module
    docstring); True if this call claimed it. Raises ObjectNotFoundError when OUT has no manifest."""
    if store.exists(claim_key(state)) or not read_lifecycle(store).notify:
        return False
    manifest = read_manifest(store)
    confirmed = {
        "succeeded": lambda: store.exists(SUCCESS_KEY),
        "failed": lambda: finished_state(store, manifest) == "failed",
        "cancelled": lambda: is_cancelled(store) and not store.exists(SUCCESS_KEY),
        "expired": lambda: store.exists(EXPIRED_KEY),
    }.get(state, lambda: False)()
    if not confirmed:
        return False
    report: dict[str, Any] | None
    if state in ("succeeded", "expired"):
        report = json.loads(store.get(COST_KEY))
    else:
        report = report_now(store, manifest, sorted(committed_shards(store)))
    if not notify_final(store, manifest, state, report, settings):
        return False
    log.warning("notify_claimed_for_a_dead_claimer", job_id=manifest.job_id, state=state,
                why="the job ended without a notification claim")  # fmt: skip
    return True


def redeliver_due(store: ObjectStore, settings: Settings, now: float) -> bool:
    """Send what is due again, give up what has had its tries (see the module docstring); True when
    every claim of the job is settled (each target delivered or given up)."""
    settled = True
    for claim, records in read_claims(store):
        for target, record in records.items():
            if record.settled:
                continue
            n = record.tries[-1] if record.tries else 0
            wait = settings.notify_redeliver_grace_s * 2**n
            if now < try_started_at(store, claim, target, n) + wait:
                settled = False  # the latest try may still be under way (its own retries)
                continue
            fields = {"job_id": claim.payload.get("job_id"), "state": claim.state,
                      "delivery_id": claim.delivery_id, "target": shown_target(target)}  # fmt: skip
            if n >= settings.notify_redeliveries:
                if mark_given_up(store, claim, target, n + 1, shown_target(target)):
                    log.error("notify_given_up", **fields, tries=n + 1, claimed_at=claim.claimed_at,
                              why="no 2xx answer to any try; raise FREIGHT_NOTIFY_REDELIVERIES to try longer")  # fmt: skip
                continue
            settled = False
            if claim_try(store, claim, target, n + 1, now):
                log.warning("notify_redelivering", **fields, redelivery=n + 1, claimed_by=claim.claimed_by)
                send_claim(store, claim, target, n + 1, settings)
    return settled


class NoticeSweep:
    """The reconcile pass's look at finished jobs' notifications (see the module docstring)."""

    def __init__(self, live: LiveState, settings: Settings) -> None:
        self.live = live
        self.settings = settings

    def run(self, states: Mapping[str, str], now: float) -> list[str]:
        """Claim what no one claimed and redeliver what is due for the finished jobs `states` (job id
        -> its final state in Redis); returns the jobs settled by this call."""
        r = self.live.client
        jobs = list(states)
        pipe = r.pipeline(transaction=False)
        for job_id in jobs:
            pipe.hget(job_key(job_id), "updated_at")
            pipe.exists(aux_key("notified", job_id))
            pipe.hget(aux_key("meta", job_id), "output")
        answers = pipe.execute()
        settled = []
        for i, job_id in enumerate(jobs):
            updated, done, output = answers[3 * i : 3 * i + 3]
            if done or updated is None or output is None:
                continue
            if now - float(updated) < self.settings.notify_redeliver_grace_s:
                continue  # just finished: its claimer is sending
            try:
                store = open_store(output, self.settings)
                claim_missing(store, self.settings, states[job_id])
                finished = redeliver_due(store, self.settings, now)
            except ObjectNotFoundError:
                finished = True  # OUT holds no job any more: nothing to tell anyone
            except Exception as exc:  # storage away (a later pass tries again) or a bad record
                log.warning("notify_sweep_failed", job_id=job_id, output=redact(output), error=str(exc))
                continue
            if finished:
                r.set(aux_key("notified", job_id), "1", ex=JOB_TTL_S)
                settled.append(job_id)
        return settled
