"""StoreIndex: which jobs, batches and eval records lie under the store, and the keys of each job.

Jobs are found as `freight jobs --prefix` finds them: every OUT/manifest.json at any depth (a
`freight run` or `submit` OUT, a served batch's tenants/<t>/jobs/<batch id>/). A full listing of
the store finds them and every job's keys at once; it runs every `scan_s` seconds. Between full
listings only the OUTs still changing (unfinished jobs, batches not yet planned) are listed again,
one listing each, and the served batches' work list (`active/`), so a batch created since the last
full listing shows at the next poll: a poll costs O(unfinished jobs) listings, however many
finished jobs the store holds.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from jobs.api.ids import BATCH_PREFIX, is_id
from jobs.api.layout import ACTIVE_PREFIX, TENANT_PATTERN, job_prefix, parse_active
from jobs.expiry import EXPIRED_KEY
from jobs.manifest import COST_KEY, MANIFEST_KEY, SHARDS_PREFIX, SUCCESS_KEY
from jobs.markers import CANCEL_KEY, FAILURES_KEY, FAILURES_PREFIX
from jobs.storage import ObjectStore

# tenants/<tenant>/batches/<batch id>.json and tenants/<tenant>/jobs/<batch id>/ (jobs/api/layout.py)
_BATCH_RECORD = re.compile(r"tenants/([a-z0-9][a-z0-9_-]{0,63})/batches/(batch_[0-9a-f]{27})\.json")
_TENANT_JOB = re.compile(r"tenants/([a-z0-9][a-z0-9_-]{0,63})/jobs/(batch_[0-9a-f]{27})")
# <history>/<suite>/<model key>/<run id>.json (jobs/evals/history.py, plan.py's run ids)
EVAL_RECORD = re.compile(
    r"(?:.*/)?[A-Za-z0-9][A-Za-z0-9_.-]*/[^/]+-[0-9a-f]{8}/\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{8}\.json"
)
WASTE_PREFIX = "waste/"


@dataclass(frozen=True)
class OutKeys:
    """One job OUT: its key under the store root ("" when the root is the OUT) and its keys, relative."""

    prefix: str
    keys: frozenset[str]
    listed_at: float  # when the keys were listed as they are (a relisting that finds the same keys keeps it)

    def _indices(self, folder: str, suffix: str) -> set[int]:
        n = len(folder)
        out = set()
        for k in self.keys:
            if k.startswith(folder) and k.endswith(suffix) and k[n : -len(suffix)].isdigit():
                out.add(int(k[n : -len(suffix)]))
        return out

    @cached_property
    def committed(self) -> set[int]:
        """Shards whose result object exists (jobs.finalize.committed_shards, from the listing)."""
        return self._indices(SHARDS_PREFIX, ".parquet")

    @cached_property
    def failed(self) -> set[int]:
        """Shards marked failed for good (jobs.markers.failed_shards, from the listing)."""
        return self._indices(FAILURES_PREFIX, ".json")

    @cached_property
    def waste(self) -> list[str]:
        return sorted(k for k in self.keys if k.startswith(WASTE_PREFIX) and k.endswith(".json"))

    @property
    def ended(self) -> bool:
        """True when nothing more will change here by itself: succeeded, failed, expired or cancelled."""
        return bool({SUCCESS_KEY, FAILURES_KEY, EXPIRED_KEY, CANCEL_KEY} & self.keys)

    def has(self, key: str) -> bool:
        return key in self.keys

    @property
    def finalized(self) -> bool:
        return COST_KEY in self.keys and SUCCESS_KEY in self.keys

    @property
    def tenant_batch(self) -> tuple[str, str] | None:
        """(tenant, batch id) when this OUT is a served batch's job."""
        match = _TENANT_JOB.fullmatch(self.prefix)
        return (match[1], match[2]) if match else None


@dataclass(frozen=True)
class StoreListing:
    """What one look at the store found."""

    outs: dict[str, OutKeys] = field(default_factory=dict)
    batches: tuple[tuple[str, str], ...] = ()  # (tenant, batch id) of every batch record
    eval_records: tuple[str, ...] = ()
    at: float = 0.0


def tenant_of(prefix: str) -> str | None:
    """The tenant whose part of the store holds `prefix` (tenants/<tenant>/...), else None."""
    match = re.match(r"tenants/([a-z0-9][a-z0-9_-]{0,63})/", prefix + "/")
    return match[1] if match else None


class StoreIndex:
    """The latest StoreListing of one store, brought up to date by `refresh`."""

    def __init__(self, store: ObjectStore, scan_s: float = 5.0) -> None:
        if scan_s <= 0:
            raise ValueError(f"scan_s must be > 0, got {scan_s}")
        self.store, self.scan_s = store, scan_s
        self._listing = StoreListing()
        self._lock = threading.Lock()

    def refresh(self, changing: Iterable[str] = (), now: float | None = None) -> StoreListing:
        """A full listing when the last is older than scan_s, else the last one with the OUTs named in
        `changing` (OUT prefixes, planned or not yet) listed again."""
        now = time.time() if now is None else now
        with self._lock:
            if now - self._listing.at >= self.scan_s:
                self._listing = self._full(now)
                return self._listing
            outs = dict(self._listing.outs)
            batches = list(self._listing.batches)
            known = set(batches)
            changing = list(changing)
            for key in self.store.list(ACTIVE_PREFIX):  # batches not final: new ones, and their jobs
                tenant, batch_id = parse_active(key)
                if (tenant, batch_id) not in known and is_id(BATCH_PREFIX, batch_id) and TENANT_PATTERN.fullmatch(tenant):
                    batches.append((tenant, batch_id))
                    changing.append(job_prefix(tenant, batch_id))
            for prefix in changing:
                keys = _relative(prefix, self.store.list(f"{prefix}/" if prefix else ""))
                if prefix and MANIFEST_KEY not in keys:
                    continue  # not planned yet: no job here
                old = outs.get(prefix)
                # an OUT whose keys did not change stays the same object, with the shard sets it
                # computed already, so its job's line is not built again (jobs/dashboard/board.py)
                if old is None or old.keys != keys:
                    outs[prefix] = OutKeys(prefix, keys, now)
            self._listing = StoreListing(outs, tuple(batches), self._listing.eval_records, self._listing.at)
            return self._listing

    def _full(self, now: float) -> StoreListing:
        keys = self.store.list("")
        roots = {k[: -len(MANIFEST_KEY)].rstrip("/") for k in keys if k.rsplit("/", 1)[-1] == MANIFEST_KEY}
        grouped: dict[str, set[str]] = {r: set() for r in roots}
        batches, evals = [], []
        owners: dict[str, str | None] = {}  # folder -> its OUT: keys of one folder share one lookup
        for key in keys:
            folder = key.rpartition("/")[0]
            if folder not in owners:
                owners[folder] = _owner(key, roots)
            owner = owners[folder]
            if owner is not None:
                grouped[owner].add(key[len(owner) + 1 :] if owner else key)
                continue
            match = _BATCH_RECORD.fullmatch(key)
            if match:
                batches.append((match[1], match[2]))
            elif EVAL_RECORD.fullmatch(key):
                evals.append(key)
        last = self._listing.outs
        outs = {r: last[r] if r in last and last[r].keys == ks else OutKeys(r, frozenset(ks), now)
                for r, ks in grouped.items()}  # fmt: skip
        return StoreListing(outs, tuple(batches), tuple(sorted(evals)), now)


def _relative(prefix: str, keys: list[str]) -> frozenset[str]:
    n = len(prefix) + 1 if prefix else 0
    return frozenset(k[n:] for k in keys)


def _owner(key: str, roots: set[str]) -> str | None:
    """The OUT (of `roots`) that `key` lies in: the nearest one above it."""
    parts = key.split("/")
    for depth in range(len(parts) - 1, -1, -1):
        candidate = "/".join(parts[:depth])
        if candidate in roots:
            return candidate
    return None

