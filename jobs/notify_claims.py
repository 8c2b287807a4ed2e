"""A notification claim in storage, and what became of each of its targets.

    OUT/notify/<state>.json                      the claim (put_if_absent: one claimer per final state)
        {delivery_id, state, claimed_at, claimed_by, targets, payload}
    OUT/notify/<state>/<delivery_id>/<t>/try-<n>.json     redelivery n >= 1 (put_if_absent: one
        sender per try, however many reconcilers race) {at, by}
    OUT/notify/<state>/<delivery_id>/<t>/delivered.json   the target answered 2xx {at, by, try}
    OUT/notify/<state>/<delivery_id>/<t>/given-up.json    no more redeliveries {at, tries, target}

`<t>` is the first 16 hex digits of SHA-256 of the target (a webhook URL may carry a token; an object
name must not). The claimer's own send is try 0 and has no try object: the claim is it. The markers
live under the delivery id, so a resubmitted job's new claim never meets an older claim's markers.
A claim written before delivery ids existed (the payload alone) is read as settled: nothing knows
whether it was delivered.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from jobs.errors import ObjectNotFoundError
from jobs.storage import ObjectStore

NOTIFY_PREFIX = "notify/"


def claim_key(state: str) -> str:
    return f"{NOTIFY_PREFIX}{state}.json"


def sender_id() -> str:
    """Who sends: `<host>/<pid>` (recorded in claims and tries, for the log and for people)."""
    return f"{socket.gethostname()}/{os.getpid()}"


def target_tag(target: str) -> str:
    return hashlib.sha256(target.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Claim:
    """One final state's notification: the payload every try sends, byte for byte."""

    delivery_id: str
    state: str
    claimed_at: float
    claimed_by: str
    targets: tuple[str, ...]
    payload: dict[str, Any]

    def body(self) -> bytes:
        """The bytes sent (and signed): the same on every try and every redelivery."""
        return json.dumps(self.payload, sort_keys=True).encode()

    def to_json(self) -> bytes:
        record = {"delivery_id": self.delivery_id, "state": self.state, "claimed_at": self.claimed_at,
                  "claimed_by": self.claimed_by, "targets": list(self.targets), "payload": self.payload}  # fmt: skip
        return json.dumps(record, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Claim | None:
        """The claim, or None for one written before delivery ids existed (or unreadable)."""
        try:
            record = json.loads(data)
            return cls(str(record["delivery_id"]), str(record["state"]), float(record["claimed_at"]),
                       str(record["claimed_by"]), tuple(record["targets"]), dict(record["payload"]))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            return None

    def target_dir(self, target: str) -> str:
        return f"{NOTIFY_PREFIX}{self.state}/{self.delivery_id}/{target_tag(target)}/"


@dataclass
class TargetRecord:
    """What storage says about one target of a claim."""

    tries: list[int] = field(default_factory=list)  # redeliveries made (1, 2, ...), sorted
    delivered: bool = False
    given_up: bool = False

    @property
    def settled(self) -> bool:
        return self.delivered or self.given_up


def read_claims(store: ObjectStore) -> list[tuple[Claim, dict[str, TargetRecord]]]:
    """Every claim of the job with its targets' records (one listing of OUT/notify/)."""
    keys = store.list(NOTIFY_PREFIX)
    out = []
    for key in keys:
        name = key[len(NOTIFY_PREFIX) :]
        if "/" in name or not name.endswith(".json"):
            continue
        try:
            claim = Claim.from_json(store.get(key))
        except ObjectNotFoundError:
            continue  # cleared by a resubmit since the listing
        if claim is None:
            continue
        records = {}
        for target in claim.targets:
            prefix = claim.target_dir(target)
            record = TargetRecord()
            for marker in (k[len(prefix) :] for k in keys if k.startswith(prefix)):
                if marker == "delivered.json":
                    record.delivered = True
                elif marker == "given-up.json":
                    record.given_up = True
                elif marker.startswith("try-") and marker.endswith(".json") and marker[4:-5].isdigit():
                    record.tries.append(int(marker[4:-5]))
            record.tries.sort()
            records[target] = record
        out.append((claim, records))
    return out


def claim_try(store: ObjectStore, claim: Claim, target: str, n: int, now: float) -> bool:
    """Take redelivery `n` of `target`; True for exactly one caller among those racing."""
    record = {"at": now, "by": sender_id()}
    return store.put_if_absent(f"{claim.target_dir(target)}try-{n}.json", json.dumps(record).encode())


def try_started_at(store: ObjectStore, claim: Claim, target: str, n: int) -> float:
    """When try `n` began (try 0: the claim)."""
    if n == 0:
        return claim.claimed_at
    try:
        return float(json.loads(store.get(f"{claim.target_dir(target)}try-{n}.json"))["at"])
    except (ObjectNotFoundError, ValueError, KeyError, TypeError):
        return claim.claimed_at


def mark_delivered(store: ObjectStore, claim: Claim, target: str, n: int) -> None:
    record = {"at": time.time(), "by": sender_id(), "try": n}
    store.put(f"{claim.target_dir(target)}delivered.json", json.dumps(record).encode())


def mark_given_up(store: ObjectStore, claim: Claim, target: str, tries: int, shown: str) -> bool:
    """Record that `target` gets no more tries; True if this call recorded it (log it once)."""
    record = {"at": time.time(), "tries": tries, "target": shown}
    return store.put_if_absent(f"{claim.target_dir(target)}given-up.json", json.dumps(record).encode())


def clear_claim(store: ObjectStore, state: str) -> None:
    """Delete `state`'s claim and every marker of it (a resubmit: its end notifies anew)."""
    store.delete(claim_key(state))
    for key in store.list(f"{NOTIFY_PREFIX}{state}/"):
        store.delete(key)
