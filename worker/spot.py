"""Spot interruption watcher: polls the EC2 instance metadata service (IMDSv2) from a daemon thread.

Every `poll_s` seconds: PUT /latest/api/token (a session token, renewed before it expires), then GET
/latest/meta-data/spot/instance-action and /latest/meta-data/events/recommendations/rebalance.
404 means "no notice"; 200 is a notice (an interruption in ~2 minutes, or a rebalance
recommendation, its early warning). On the first notice the watcher calls `on_notice` once and stops.
Off EC2 (the token request cannot connect) it gives up after a few tries and says so once.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from jobs.log import get_logger

log = get_logger(__name__)

TOKEN_TTL_S = 21600
ACTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
INSTANCE_ID_PATH = "/latest/meta-data/instance-id"


@dataclass(frozen=True)
class SpotNotice:
    """An interruption notice: kind is "instance-action" (action + time) or "rebalance"."""

    kind: str
    action: str | None
    time: str | None
    seen_at: float  # unix seconds


class ImdsClient:
    """A minimal IMDSv2 client (urllib; no boto): token, then GETs with the token header."""

    def __init__(self, base_url: str, *, timeout_s: float = 1.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._token: str | None = None
        self._token_expires = 0.0

    def _refresh_token(self) -> str:
        if self._token is None or time.monotonic() > self._token_expires:
            req = urllib.request.Request(
                self.base_url + "/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                self._token = resp.read().decode()
            self._token_expires = time.monotonic() + TOKEN_TTL_S - 60
        return self._token

    def get(self, path: str) -> str | None:
        """The body at `path`, or None on 404. A 401 (expired token) is retried once with a new token."""
        for _ in range(2):
            token = self._refresh_token()
            req = urllib.request.Request(self.base_url + path, headers={"X-aws-ec2-metadata-token": token})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return resp.read().decode()
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401:
                    self._token = None
                    continue
                raise
        return None

    def notice(self) -> SpotNotice | None:
        """The current notice, if any: an instance action first, else a rebalance recommendation."""
        body = self.get(ACTION_PATH)
        if body is not None:
            data = _json_or_empty(body)
            return SpotNotice("instance-action", data.get("action"), data.get("time"), time.time())
        body = self.get(REBALANCE_PATH)
        if body is not None:
            data = _json_or_empty(body)
            return SpotNotice("rebalance", None, data.get("noticeTime"), time.time())
        return None

    def instance_id(self) -> str | None:
        try:
            return self.get(INSTANCE_ID_PATH)
        except (OSError, urllib.error.URLError):
            return None


def _json_or_empty(body: str) -> dict:
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


class SpotWatcher:
    """Daemon thread: poll `client.notice()` every `poll_s`; call `on_notice(notice)` once, then stop."""

    def __init__(
        self,
        client: ImdsClient,
        on_notice: Callable[[SpotNotice], None],
        *,
        poll_s: float = 5.0,
        give_up_after: int = 3,
    ) -> None:
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s}")
        self.client = client
        self.on_notice = on_notice
        self.poll_s = poll_s
        self.give_up_after = give_up_after
        self.notice: SpotNotice | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="freight-spot-watcher", daemon=True)

    def start(self) -> SpotWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def poll_once(self) -> SpotNotice | None:
        """One poll; on a notice records it and calls `on_notice`."""
        notice = self.client.notice()
        if notice is not None and self.notice is None:
            self.notice = notice
            log.warning("spot_notice", kind=notice.kind, action=notice.action, at=notice.time)
            self.on_notice(notice)
        return notice

    def _run(self) -> None:
        failures = 0
        reachable = False
        while not self._stop.is_set():
            try:
                if self.poll_once() is not None:
                    return
                failures, reachable = 0, True
            except (OSError, urllib.error.URLError, ValueError) as exc:
                failures += 1
                if not reachable and failures >= self.give_up_after:
                    log.info("spot_watcher_off", reason=f"metadata service unreachable: {exc}")
                    return
                log.warning("spot_poll_failed", error=str(exc), failures=failures)
            self._stop.wait(self.poll_s)
