"""OpenAI's cursor pages: `{"object": "list", "data", "first_id", "last_id", "has_more"}`.

Ids sort by creation time (jobs/api/ids.py), so a page is a slice of the sorted key listing after
the `after` id, and only the records shown are read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

from jobs.api.errors import bad_request


def page(
    ids: list[str],
    records: Callable[[list[str]], Iterable[dict[str, Any]]],
    *,
    after: str | None,
    limit: int,
    newest_first: bool,
    what: str,
) -> dict[str, Any]:
    """The page of up to `limit` objects after `after` in the chosen order. `ids`: oldest first;
    `records(ids)` yields the objects of those ids that exist (it may skip some: expired files).
    An `after` that names none of `ids` is a 400: a cursor must be an id of the previous page."""
    ordered = ids[::-1] if newest_first else ids
    start = 0
    if after is not None:
        try:
            start = ordered.index(after) + 1
        except ValueError:
            raise bad_request(
                f"Invalid 'after' {after!r}: it names no {what} of yours; give the id of the last {what} of "
                "the previous page (or leave it out for the first page).", "after", "invalid_value",
            ) from None  # fmt: skip
    data = list(islice(records(ordered[start:]), limit + 1))
    shown = data[:limit]
    return {
        "object": "list",
        "data": shown,
        "first_id": shown[0]["id"] if shown else None,
        "last_id": shown[-1]["id"] if shown else None,
        "has_more": len(data) > limit,
    }
