"""Duplicate rows of a shard, computed once.

Two deterministic rows (worker/row_key.py) with the same answer digest get the same answer: the
first in shard order runs, each copy takes its result under its own row number and id (and its own
endpoint, which names the request's url, and response_fields, which its response repeats of its own
request: neither is the answer) as soon as it finishes. Copies are marked
`duplicate`, so the shard's record bills their tokens as saved, not computed. The planner keeps rows
with equal prompts in one shard where it can (jobs/planner.py), so a job's duplicates meet here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from jobs.endpoints import URL_OF_ENDPOINT
from worker.row_key import deterministic, row_digest
from worker.row_requests import RowRequest
from worker.shard_rows import RowResult


@dataclass
class Duplicates:
    """A shard's requests split into those to run (`unique`, shard order kept) and the copies of each
    (`copies`: the row number of the request that runs -> the requests that take its answer)."""

    unique: list[RowRequest]
    copies: dict[int, list[RowRequest]] = field(default_factory=dict)

    @property
    def copy_count(self) -> int:
        return sum(len(c) for c in self.copies.values())

    def fill(self, res: RowResult, results: dict[int, RowResult], report: Callable[[RowResult], None]) -> None:
        """`res` (a row that ran) finished: record and report each of its copies."""
        for req in self.copies.get(res.row, ()):
            results[req.row] = copy_result(res, req)
            report(results[req.row])


def copy_result(res: RowResult, req: RowRequest) -> RowResult:
    """`res` as the answer of `req`, a duplicate of the row it answered."""
    return dataclasses.replace(res, row=req.row, id=req.id, endpoint=URL_OF_ENDPOINT[req.endpoint],
                               response_fields=req.response_fields, duplicate=True)  # fmt: skip


def find_duplicates(requests: list[RowRequest]) -> Duplicates:
    """Group `requests` (rows without an error) by answer digest; non-deterministic rows always run."""
    first: dict[bytes, RowRequest] = {}
    out = Duplicates(unique=[])
    for req in requests:
        if not deterministic(req):
            out.unique.append(req)
            continue
        digest = row_digest(req)
        original = first.setdefault(digest, req)
        if original is req:
            out.unique.append(req)
        else:
            out.copies.setdefault(original.row, []).append(req)
    return out
