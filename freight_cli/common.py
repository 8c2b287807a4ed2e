"""What every command module shares: the one-line error exit, exit codes, and naming a job by id or OUT.

Command modules import this one (never each other's helpers), so the CLI has no import circles.
"""

from __future__ import annotations

from pathlib import Path

import redis
import typer
from rich.console import Console

from jobs.errors import FreightError
from jobs.settings import get_settings

EXIT_JOB_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_JOB_EXPIRED = 4  # `freight run` / `freight wait`: the job ended past its deadline (3: wait timed out)
EXIT_INTERRUPTED = 130  # 128 + SIGINT; a run stopped by SIGTERM exits 128 + 15 = 143


def fail(message: str, code: int = EXIT_USER_ERROR) -> typer.Exit:
    """Print one clear line on stderr (URL passwords and tokens redacted); return the Exit to raise."""
    from jobs.redact import redact

    Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {redact(message)}", soft_wrap=True)
    return typer.Exit(code)


def plural(n: int, noun: str) -> str:
    """`noun` for one, `noun`s otherwise ("1 shard", "3 shards")."""
    return noun if n == 1 else noun + "s"


def _is_out(job_or_out: str) -> bool:
    return "/" in job_or_out or job_or_out.startswith("s3://") or Path(job_or_out).exists()


def resolve_job(job_or_out: str) -> tuple[str, str]:
    """(job_id, OUT) from either: a path / s3:// URL is OUT; 16 hex digits is a job id Redis knows."""
    from jobs.live_state import LiveState
    from jobs.manifest import read_manifest
    from jobs.storage import open_store

    settings = get_settings()
    if _is_out(job_or_out):
        manifest = read_manifest(open_store(job_or_out, settings))
        return manifest.job_id, manifest.spec.output
    live = LiveState(settings.redis_url, socket_timeout=2.0, retry_for_s=0)
    try:
        output = live.job_meta(job_or_out).get("output")
    except redis.RedisError as exc:
        raise FreightError(
            f"cannot ask Redis about job {job_or_out!r} ({exc}): pass its OUT instead"
        ) from None
    finally:
        live.close()
    if not output:
        raise FreightError(f"Redis knows no job {job_or_out!r}: pass its OUT (folder or s3:// URL) instead")
    return job_or_out, output


def resolve_out(job_or_out: str) -> str:
    """OUT for `freight status`: the argument itself unless it is a job id Redis knows."""
    if _is_out(job_or_out):
        return job_or_out
    return resolve_job(job_or_out)[1]
