"""A submission's lifecycle options: when the job is due, and whom to tell when it ends.

They belong to a submission, not to the job spec (a resubmit with the same spec is the same job,
resumed), so they live beside the manifest in `OUT/lifecycle.json`, replaced by each submit or run:

    {"deadline": unix seconds | null, "notify": ["https://...", "sns:arn:aws:sns:..."],
     "submitted_at": unix seconds}

A webhook URL that carries a credential is stored sealed (jobs/notify_targets.py).

The deadline also goes to Redis (`freight:job:<id>` field `deadline`), where the autoscaler reads it.
"""

from __future__ import annotations

import json
import re
import time

from pydantic import BaseModel, ConfigDict, Field, field_validator

from jobs.errors import ObjectNotFoundError
from jobs.storage import ObjectStore

LIFECYCLE_KEY = "lifecycle.json"
MIN_WINDOW_S = 60.0  # a completion window under a minute is refused: the job could not even load
_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_SNS_ARN = re.compile(r"arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?")


class Lifecycle(BaseModel):
    """The lifecycle options of the job's latest submission (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    deadline: float | None = Field(None, description="unix seconds; past it the job stops and expires")
    notify: tuple[str, ...] = Field((), description="webhook URLs (http/https) and sns:ARN targets")
    submitted_at: float = Field(default_factory=time.time)

    @field_validator("notify")
    @classmethod
    def _check_targets(cls, targets: tuple[str, ...]) -> tuple[str, ...]:
        for target in targets:
            check_notify_target(target.split(" sealed:", 1)[0])  # a sealed URL: jobs/notify_targets.py
        return targets

    def past_due(self, now: float | None = None) -> bool:
        return self.deadline is not None and (time.time() if now is None else now) >= self.deadline


def parse_window(text: str, minimum: float = MIN_WINDOW_S, name: str = "--completion-window") -> float:
    """A completion window in seconds: a duration (24h, 30m, 1h30m, 2d, 90s), at least `minimum`
    seconds; ValueError naming `name` (the flag or field) otherwise."""
    value = text.strip().lower()
    match = _DURATION.fullmatch(value)
    if not value or not match:
        raise ValueError(f"{name} {text!r} is not a duration: give e.g. 24h, 30m, 1h30m or 2d")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    window = days * 86400.0 + hours * 3600.0 + minutes * 60.0 + seconds
    if window < minimum:
        if minimum == MIN_WINDOW_S:
            raise ValueError(f"{name} {text!r} is under a minute: give 1m or more")
        raise ValueError(f"{name} {text!r} is shorter than {minimum:g}s: give {minimum:g}s or more")
    return window


def check_notify_target(target: str) -> str:
    """`target` when it is an http(s) URL with a host or `sns:<topic ARN>`; ValueError (one line) else."""
    if target.startswith("sns:"):
        if not _SNS_ARN.fullmatch(target[4:]):
            raise ValueError(
                f"--notify {target!r}: give sns: followed by a topic ARN "
                "(sns:arn:aws:sns:us-east-1:123456789012:topic)"
            )
        return target
    scheme, sep, rest = target.partition("://")
    if any(c.isspace() or not c.isprintable() for c in target):
        raise ValueError(f"--notify {target!r}: a URL holds no spaces or control characters: percent-encode them")
    if not sep or scheme.lower() not in ("http", "https") or not rest.split("/", 1)[0]:
        raise ValueError(f"--notify {target!r}: give an http(s):// webhook URL or sns:<topic ARN>")
    return target


def write_lifecycle(store: ObjectStore, lifecycle: Lifecycle) -> None:
    """Replace OUT/lifecycle.json (each submission's options replace the last one's)."""
    store.put(LIFECYCLE_KEY, lifecycle.model_dump_json(indent=1).encode())


def read_lifecycle(store: ObjectStore) -> Lifecycle:
    """OUT/lifecycle.json, or no deadline and no targets when the job never had one (older jobs)."""
    try:
        return Lifecycle.model_validate(json.loads(store.get(LIFECYCLE_KEY)))
    except ObjectNotFoundError:
        return Lifecycle(submitted_at=0.0)
