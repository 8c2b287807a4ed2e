"""Process settings: read once from the environment (prefix FREIGHT_), validated, passed explicitly."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from jobs.webhook_address import IPNetwork, parse_allow


class Settings(BaseSettings):
    """Everything freight reads from the environment. Construct once; pass it where needed."""

    model_config = SettingsConfigDict(env_prefix="FREIGHT_", frozen=True, extra="ignore")

    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Celery broker and live progress")
    s3_endpoint_url: str | None = Field(None, description="S3-compatible endpoint (MinIO, moto, ...)")
    # the S3 client's bounds (jobs/storage/s3.py, make_s3_client): a hung endpoint costs one call at
    # most s3_max_attempts x (the timeout that fired + its backoff, <= 20 s), not botocore's 5 x 60 s
    s3_connect_timeout_s: float = Field(
        10.0, gt=0, le=300, description="seconds to open a connection to S3; urllib3 also sends each "
        "request body under it, so it bounds a stalled upload's socket writes too: keep it >= 5 s for "
        "large result uploads"
    )
    s3_read_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="seconds S3 may leave a socket read waiting (for the answer "
        "to a request, or for the next bytes of a download): per read, not per request, so large "
        "objects that keep moving never hit it"
    )
    s3_max_attempts: int = Field(
        5, ge=1, le=20, description="tries of one S3 call (the first included), botocore's standard "
        "retry mode: refused or dropped connections, timeouts, throttling (SlowDown) and 5xx are "
        "retried with jittered exponential backoff"
    )
    imds_url: str = Field("http://169.254.169.254", description="EC2 instance metadata service base URL")
    cache_dir: Path = Field(Path.home() / ".cache" / "freight", description="downloaded models, etc.")
    model_cache_bytes: int = Field(
        0, ge=0, description="most bytes of downloaded models kept (least recently used go first); 0 = "
        "as many as the disk holds (models go only when a new one would not fit)"
    )
    max_n: int = Field(
        16, ge=1, le=1024, description="choices one row may ask for (n), at most; a row over it is that "
        "row's error, a job-wide --n over it is refused at submit"
    )
    max_batch_file_bytes: int = Field(
        256 << 20, ge=1 << 10, description="most bytes of an OpenAI-Batch JSONL input, measured "
        "decompressed for .jsonl.gz: the file is parsed whole in memory, once, at submit"
    )
    constraint_check_timeout_s: float = Field(
        20.0, gt=0, le=600, description="most seconds submit spends compiling a job-wide --regex / "
        "--json-schema / --choice against the model's tokenizer (jobs/constraint_probe.py) before it "
        "refuses the constraint as too costly"
    )
    log_format: str = Field("auto", pattern="^(auto|json|console)$", description="auto: console on a TTY")
    log_level: str = Field("info", pattern="^(debug|info|warning|error)$")
    # distributed mode (docs/ARCHITECTURE.md, "Distributed mode")
    visibility_timeout_s: int = Field(
        300, ge=2, description="broker redelivers an unacked shard after this (a backstop: a vanished "
        "worker's shards come back after 60 s without its beat); running shards renew it"
    )
    orphan_grace_s: float = Field(
        10.0, gt=0, description="a shard Redis calls queued or running, with no message and no live "
        "attempt, is published again once it has been seen so this long (jobs/reconcile.py)"
    )
    submit_redis_retry_s: float = Field(
        5.0, ge=0, le=600, description="how long `freight submit` keeps retrying a Redis that does not answer "
        "(backoff 0.1 s doubling to 2 s) before it fails with a message; 0 = fail at the first refusal"
    )
    wait_reconcile_s: float = Field(
        10.0, gt=0, description="how often `freight wait` checks its job's Redis state against storage"
    )
    max_shard_attempts: int = Field(3, ge=1, le=100, description="attempts that crash before a shard fails")
    max_shard_node_losses: int = Field(
        10, ge=1, le=1000, description="attempts lost with their whole worker (machine gone, no notice) "
        "before a shard fails; a shard that takes its machine down every time is poison too"
    )
    max_shard_storage_outages: int = Field(
        20, ge=1, le=1000, description="attempts that end because storage did not answer (unreachable, "
        "timeouts, SlowDown, 5xx) before a shard fails; not the shard's fault, so they use none of "
        "FREIGHT_MAX_SHARD_ATTEMPTS (worker/outages.py)"
    )
    storage_outage_backoff_cap_s: float = Field(
        300.0, gt=0, le=3600, description="most seconds a worker waits before requeueing an attempt that "
        "storage did not answer: 2, 4, 8 ... s up to this (20 outages at the defaults span about an hour)"
    )
    spot_poll_s: float = Field(5.0, gt=0, description="seconds between instance-metadata polls")
    metrics_port: int = Field(9450, ge=0, le=65535, description="Prometheus port of a worker; 0 = off")
    heartbeat_s: float = Field(10.0, gt=0, description="seconds between worker heartbeats in Redis")
    # per-attempt deadline (worker/deadline.py): the worker's main process kills an attempt past it
    shard_deadline_margin: float = Field(
        5.0, ge=0, description="an attempt may take this many times the time its token estimate needs "
        "at the model's measured rate; 0 = no deadline"
    )
    shard_deadline_floor_s: float = Field(600.0, gt=0, description="no attempt is killed sooner than this")
    shard_deadline_unmeasured_s: float = Field(
        3600.0, gt=0, description="the deadline while the model has no measured rate yet, and for the "
        "model load before the first engine step"
    )
    profiles_path: Path | None = Field(
        None, description="the throughput profile store of `freight estimate` (default: cache_dir/profiles.json)"
    )
    result_cache: str | None = Field(
        None, description="the result cache of run / submit / estimate / eval, and the root of serve's "
        "per-tenant caches, when --result-cache is not given: a folder or s3://bucket/prefix "
        "(docs/design/result-cache.md); `off`, `none` or empty: none"
    )
    # the dashboard (jobs/dashboard/)
    dashboard_secret: SecretStr | None = Field(
        None, min_length=32, description="key that signs the dashboard's session and CSRF cookies; give "
        "the same one to every replica behind one address (default: a random key per process, so "
        "sessions end when it restarts)"
    )
    # notifications (jobs/notify.py)
    webhook_secret: SecretStr | None = Field(
        None, description="key of the HMAC-SHA256 signature (X-Freight-Signature) of webhook bodies"
    )
    sns_endpoint_url: str | None = Field(None, description="SNS endpoint (moto, LocalStack); None: AWS")
    notify_attempts: int = Field(6, ge=1, le=100, description="tries per send (one try or one redelivery) before that send gives up")
    notify_backoff_s: float = Field(1.0, gt=0, description="first retry delay; doubles each try, 60 s at most")
    notify_timeout_s: float = Field(
        5.0, gt=0, le=300, description="seconds one webhook try may take in all (connect, TLS, send, the "
        "answer's status and headers): a total deadline, however slowly the receiver trickles bytes"
    )
    notify_concurrency: int = Field(
        8, ge=1, le=256, description="webhook tries one process sends at once: a slow receiver holds one "
        "sender at most FREIGHT_NOTIFY_TIMEOUT_S and never delays the others"
    )
    notify_allow: str = Field(
        "", description="addresses and CIDR networks (comma separated: 10.2.3.4,192.168.0.0/16) a webhook "
        "may reach although not public; every other loopback, private, link-local (instance metadata) "
        "or reserved address is refused at submit and at each send (jobs/webhook_address.py)"
    )
    notify_drain_s: float = Field(
        5.0, ge=0, description="how long `freight run` / `freight cancel` wait for pending notifications at exit"
    )
    notify_redeliver_grace_s: float = Field(
        120.0, gt=0, description="a claimed notification not yet delivered to a target is sent again by the "
        "workers' reconcile pass this long after its claim (its claimer died, or every try failed); each "
        "further redelivery waits twice as long as the one before"
    )
    notify_redeliveries: int = Field(
        5, ge=0, le=20, description="redeliveries per target before it is given up (recorded in "
        "OUT/notify/ and logged as notify_given_up); 0 = none: at most once"
    )

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, url: str) -> str:
        return redis_url_with_userinfo(url)

    @field_validator("notify_allow")
    @classmethod
    def _check_allow(cls, text: str) -> str:
        parse_allow(text)
        return text

    @property
    def notify_allow_networks(self) -> tuple[IPNetwork, ...]:
        """FREIGHT_NOTIFY_ALLOW as networks."""
        return parse_allow(self.notify_allow)


def redis_url_with_userinfo(url: str) -> str:
    """`url` with a `?password=` / `?username=` query moved into its userinfo
    (`redis://h:6379/0?password=p` -> `redis://:p@h:6379/0`): redis-py takes either form, but Celery's
    broker URL parser (kombu) fails on the query one. ValueError when both forms give a password."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.query:
        return url
    query = parse_qsl(parts.query, keep_blank_values=True)
    moved = {k: v for k, v in query if k in ("password", "username")}
    if not moved:
        return url
    if "password" in moved and parts.password is not None:
        raise ValueError("gives a password twice (in user:password@ and in ?password=): keep one")
    user = moved.get("username", unquote(parts.username or ""))
    password = moved.get("password", unquote(parts.password or ""))
    host = parts.netloc.rpartition("@")[2]
    userinfo = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
    rest = urlencode([(k, v) for k, v in query if k not in moved])
    return urlunsplit((parts.scheme, f"{userinfo}@{host}" if userinfo else host, parts.path, rest, parts.fragment))


def settings_error(exc: ValidationError) -> str:
    """One line naming each bad FREIGHT_ variable, its value (redacted) and what it must be."""
    from jobs.redact import redact

    parts = []
    for err in exc.errors():
        name = "FREIGHT_" + str(err["loc"][0]).upper() if err.get("loc") else "a FREIGHT_ variable"
        parts.append(f"{name}={redact(repr(err.get('input')))}: {err['msg'].lower()}")
    return "; ".join(parts) + ": fix or unset it in the environment"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, parsed on first use (tests build their own `Settings(...)`)."""
    return Settings()
