"""ObjectCache: parsed objects that never change once written, read from the store once per process.

A job's manifest, its shards' cost records, its waste records, a finalized job's cost.json and an
eval run's record are written once (put_if_absent, or before anything reads them) and never
rewritten, so the dashboard keeps them parsed, keyed by URL, and a poll reads only what is new.
Bounded: the least recently used entries go first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_ENTRIES = 200_000  # a 10,000-shard job holds ~10,000 records: room for many such jobs


class ObjectCache:
    def __init__(self, entries: int = DEFAULT_ENTRIES) -> None:
        if entries < 1:
            raise ValueError(f"entries must be >= 1, got {entries}")
        self.entries = entries
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, url: str, load: Callable[[], T]) -> T:
        """The object at `url`: cached, or `load()`ed and kept. A load that raises keeps nothing."""
        with self._lock:
            if url in self._items:
                self._items.move_to_end(url)
                return self._items[url]
        value = load()
        with self._lock:
            self._items[url] = value
            self._items.move_to_end(url)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)
        return value

    def peek(self, url: str) -> Any:
        """The cached object at `url`, or None."""
        with self._lock:
            return self._items.get(url)

    def __len__(self) -> int:
        return len(self._items)
