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


def test_processes_sharing_one_log_file_write_whole_lines(tmp_path) -> None:
    """A worker's main process and its forked pool processes log to one stderr (a file or a pipe that
    a log shipper reads as JSON lines): each line must reach it in one write, or two processes'
    lines interleave into one that no longer parses (as a line and its newline written apart would)."""
    import os
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        "from jobs.log import configure_logging, get_logger\n"
        "configure_logging('json', 'info')\n"
        "kids = []\n"
        "for _ in range(3):\n"  # the parent and three forked children: four processes
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        kids = None\n"
        "        break\n"
        "    kids.append(pid)\n"
        "log = get_logger('t')\n"
        "for i in range(3000):\n"
        "    log.info('line', pid=os.getpid(), i=i, pad='x' * 40)\n"
        "for k in kids or []:\n"
        "    os.waitpid(k, 0)\n"
    )
    path = tmp_path / "shared.log"
    with open(path, "wb") as out:  # one file offset shared by every process, as a worker's stderr
        subprocess.run([sys.executable, "-c", script], stderr=out, check=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})  # fmt: skip
    lines = path.read_text().splitlines()
    assert len(lines) == 4 * 3000
    assert all(json.loads(line)["event"] == "line" for line in lines)
