"""What an operator of `freight serve` relies on: flat memory under a large upload, the `freight keys`
commands, and no key in any log line or stored object."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from tests.api.serve_harness import FREIGHT, ServeProcess, batch_line


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS reset needs Linux /proc")
def test_a_100_mb_upload_keeps_the_server_memory_flat(serve_process: Callable[..., ServeProcess], tmp_path: Path) -> None:
    server = serve_process()
    client = server.client(server.key("team-a"))
    line = batch_line("x", "y" * 1950)  # ~2 kB: 50,000 lines (OpenAI's most) make 100 MB
    big = tmp_path / "big.jsonl"
    with big.open("w") as f:
        for i in range(50_000):
            f.write(line.replace('"x"', f'"r{i}"') + "\n")
    assert big.stat().st_size > 100_000_000
    pid = server.process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the current RSS
    before = _status_kib(pid, "VmRSS")
    uploaded = client.files.create(file=big.open("rb"), purpose="batch")
    peak = _status_kib(pid, "VmHWM")
    assert uploaded.bytes == big.stat().st_size
    assert (peak - before) < 50 * 1024, f"RSS grew {(peak - before) / 1024:.1f} MB during a 100 MB upload"
    assert (server.store_dir / "tenants" / "team-a" / "files" / f"{uploaded.id}.jsonl").stat().st_size == uploaded.bytes


def test_keys_commands_and_no_key_is_logged_or_stored(serve_process: Callable[..., ServeProcess], tmp_path: Path) -> None:
    server = serve_process("--access-log")
    store = str(server.store_dir)

    def freight(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([FREIGHT, "keys", *args, "--store", store],
                              capture_output=True, text=True)  # fmt: skip

    made = freight("create", "--tenant", "team-a", "--name", "ci")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("fk-") and len(key) > 40 and key not in made.stderr
    listed = json.loads(freight("list", "--json").stdout)
    (record,) = listed
    assert record["tenant"] == "team-a" and record["name"] == "ci" and record["revoked_at"] is None
    assert key not in json.dumps(listed)
    client = server.client(key)
    path = tmp_path / "in.jsonl"
    path.write_text(batch_line("a") + "\n")
    client.files.create(file=path.open("rb"), purpose="batch")
    with pytest.raises(openai.AuthenticationError):
        server.client(key + "x").files.list()
    assert freight("revoke", record["key_id"]).returncode == 0
    time.sleep(1.0)
    with pytest.raises(openai.AuthenticationError):
        client.files.list()
    bad = freight("create", "--tenant", "Not A Name")
    assert bad.returncode == 2 and "tenant" in bad.stderr and "lowercase" in bad.stderr
    assert freight("revoke", "ffffffffffff").returncode == 2
    limits = subprocess.run([FREIGHT, "keys", "limits", "--tenant", "team-a", "--store",
                             store, "--max-stored", "10MB", "--max-batches-in-flight", "3"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    assert json.loads(limits.stdout) == {"max_stored_bytes": 10_000_000, "max_batches_in_flight": 3}
    server.stop()
    log = server.log.read_text()
    assert '"event": "request"' in log and "/v1/files" in log  # the access log is on
    assert key not in log and key[3:20] not in log
    for stored in server.store_dir.rglob("*"):
        if stored.is_file():
            assert key.encode() not in stored.read_bytes(), stored
