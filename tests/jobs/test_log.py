"""structlog set-up: JSON lines off a terminal, to whatever sys.stderr is at the time of each write."""

import io
import json

from jobs.log import configure_logging, get_logger


def test_json_lines_follow_the_current_stderr(monkeypatch) -> None:
    """A stream swapped in (and closed) after configuration, as typer's CliRunner does, must not
    break later log calls: the line goes to the stderr of the moment."""
    configure_logging("json", "info")
    first = io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    get_logger("t").info("one", n=1)
    first.close()  # the swapped-in stream goes away; the original comes back
    second = io.StringIO()
    monkeypatch.setattr("sys.stderr", second)
    get_logger("t").warning("two", n=2)
    line = json.loads(second.getvalue())
    assert (line["event"], line["n"], line["level"]) == ("two", 2, "warning")
    monkeypatch.undo()
    configure_logging()
