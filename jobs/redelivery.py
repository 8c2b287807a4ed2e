"""Redelivery of notifications whose claimer died before a target answered (jobs/notify.py).

`redeliver_due(store, settings, now)` looks at one job's claims (jobs/notify_claims.py): a target
with neither a delivered nor a given-up record, whose latest try began at least
FREIGHT_NOTIFY_REDELIVER_GRACE_S x 2^n ago (n: redeliveries so far; try 0 is the claim itself), gets
redelivery n + 1: it is taken with put_if_absent (`try-<n+1>.json`), so of two reconcilers racing
exactly one sends, and sent on this process's background sender with the claim's delivery id and
body bytes; a 2xx records `delivered.json`. Once FREIGHT_NOTIFY_REDELIVERIES redeliveries have had
their wait, the target is given up: `given-up.json` and one `notify_given_up` error in the log.

`NoticeSweep.run(job_ids, now)` is the Redis side, run by the reconcile pass (jobs/reconcile.py) over
the finished jobs: a job finished at least the grace ago and not yet settled is looked at in
storage; once every claim of it is delivered or given up (or it has none), `freight:notified:<job>`
is set and the job is not read again (the key expires with the job's others; a resubmit drops it).
"""

from __future__ import annotations

from collections.abc import Iterable

from jobs.live_state import LiveState
from jobs.log import get_logger
from jobs.notify import send_claim
from jobs.notify_claims import claim_try, mark_given_up, read_claims, try_started_at
from jobs.progress import JOB_TTL_S, aux_key, job_key
from jobs.redact import redact
from jobs.settings import Settings
from jobs.storage import ObjectStore, open_store

log = get_logger(__name__)


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
                      "delivery_id": claim.delivery_id, "target": redact(target)}  # fmt: skip
            if n >= settings.notify_redeliveries:
                if mark_given_up(store, claim, target, n + 1, redact(target)):
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

    def run(self, job_ids: Iterable[str], now: float) -> list[str]:
        """Redeliver what is due for `job_ids` (finished jobs); returns the jobs settled by this call."""
        r = self.live.client
        jobs = list(job_ids)
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
                finished = redeliver_due(open_store(output, self.settings), self.settings, now)
            except Exception as exc:  # storage away (a later pass tries again) or a bad record
                log.warning("notify_sweep_failed", job_id=job_id, output=redact(output), error=str(exc))
                continue
            if finished:
                r.set(aux_key("notified", job_id), "1", ex=JOB_TTL_S)
                settled.append(job_id)
        return settled
