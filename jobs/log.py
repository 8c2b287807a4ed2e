"""structlog set-up: JSON lines off a terminal, readable console output on one."""

from __future__ import annotations

import logging
import sys

import structlog

from jobs.redact import redact_processor


class _CurrentStderr:
    """Writes to sys.stderr as it is at each write, not as it was when logging was configured: a
    CLI runner (typer's CliRunner in tests, a daemon) may swap and close the stream it replaced, and
    a worker thread still logging afterwards must not die on "I/O operation on closed file"."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """Configure structlog for the process. `fmt`: auto | json | console."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer = structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            redact_processor,  # no password or token of a URL reaches a log line
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # one write per line (the line and its newline together): a worker's forked pool processes
        # share its stderr, and a line written in two parts interleaves with another process's line
        logger_factory=structlog.WriteLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)
