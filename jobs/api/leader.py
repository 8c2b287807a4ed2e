"""Which batch process does the batch work of a store: one at a time, the holder of a lock object.

`serve/batch-process.lock` holds {holder, host, pid, at}; its holder rewrites `at` every `renew_s`.
Another process takes the lock over when it is stale: its holder is a dead process on this host, or
`at` is older than `stale_s`. So servers started on one store (replicas, or a restart while the old
process dies) never run one batch twice at once; a standby takes over within `stale_s` of the
leader's death, at once when it died on the same host. A leader that finds the lock no longer its
own (it stalled past `stale_s`) stops leading.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from typing import Any

from jobs.api.layout import LOCK_KEY
from jobs.errors import ObjectNotFoundError
from jobs.log import get_logger
from jobs.storage import ObjectStore

log = get_logger(__name__)


class Leadership:
    def __init__(self, store: ObjectStore, renew_s: float = 5.0, stale_s: float = 30.0) -> None:
        self.store, self.renew_s, self.stale_s = store, renew_s, stale_s
        self.holder = uuid.uuid4().hex
        self._renewed = 0.0
        self.leading = False

    def _body(self) -> bytes:
        return json.dumps({"holder": self.holder, "host": socket.gethostname(), "pid": os.getpid(),
                           "at": time.time()}).encode()  # fmt: skip

    def hold(self) -> bool:
        """Take, keep or renew the lock; True while this process leads."""
        try:
            current: dict[str, Any] | None = json.loads(self.store.get(LOCK_KEY))
        except ObjectNotFoundError:
            current = None
        except ValueError:
            current = {}  # unreadable: stale
        now = time.time()
        if current is not None and current.get("holder") == self.holder:
            if now - self._renewed >= self.renew_s:
                self.store.put(LOCK_KEY, self._body())
                self._renewed = now
            return self._lead(True)
        if current is not None and not self._stale(current, now):
            return self._lead(False)
        if current is not None:
            self.store.delete(LOCK_KEY)
        won = self.store.put_if_absent(LOCK_KEY, self._body())
        if won:
            self._renewed = now
        return self._lead(won)

    def _stale(self, current: dict[str, Any], now: float) -> bool:
        if current.get("host") == socket.gethostname() and isinstance(current.get("pid"), int):
            try:
                os.kill(current["pid"], 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                pass  # alive, another user's
        return now - float(current.get("at", 0)) > self.stale_s

    def _lead(self, leading: bool) -> bool:
        if leading != self.leading:
            log.info("batch_process_leads" if leading else "batch_process_waits", holder=self.holder)
        self.leading = leading
        return leading

    def release(self) -> None:
        """Give the lock up (when it is still this process's)."""
        try:
            if json.loads(self.store.get(LOCK_KEY)).get("holder") == self.holder:
                self.store.delete(LOCK_KEY)
        except (ObjectNotFoundError, ValueError):
            pass
        self.leading = False
