"""What an operator of `freight serve` relies on: flat memory under a large upload, retention, the
`freight keys` commands, and no key in any log line or stored object."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from tests.api.serve_harness import FREIGHT, ServeProcess, batch_line, wait_batch


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


@pytest.mark.slow
def test_expired_files_and_outputs_are_swept(serve_process: Callable[..., ServeProcess], served_model: Path,
                                             tmp_path: Path) -> None:  # fmt: skip
    server = serve_process("--file-ttl", "4s", "--output-ttl", "4s", "--sweep", "0.5")
    client = server.client(server.key("team-a"))
    path = tmp_path / "in.jsonl"
    path.write_text(batch_line("a", model=str(served_model), max_tokens=4) + "\n")
    upload = client.files.create(file=path.open("rb"), purpose="batch")
    assert upload.expires_at == upload.created_at + 4
    batch = wait_batch(client, client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                                     completion_window="24h").id)  # fmt: skip
    assert batch.status == "completed" and batch.output_file_id
    out = client.files.retrieve(batch.output_file_id)
    assert out.expires_at == out.created_at + 4
    job = server.store_dir / "tenants" / "team-a" / "jobs" / batch.id
    assert list((job / "shards").iterdir())
    deadline = time.monotonic() + 30
    files = server.store_dir / "tenants" / "team-a" / "files"
    while any(files.iterdir()) or (job / "shards").exists() and any((job / "shards").iterdir()):
        assert time.monotonic() < deadline, sorted(p.name for p in files.iterdir())
        time.sleep(0.2)
    assert client.files.list().data == []
    for file_id in (upload.id, batch.output_file_id):
        with pytest.raises(openai.NotFoundError):
            client.files.content(file_id)
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(file_id)
    assert (job / "cost.json").exists()  # the batch's cost report stays
    assert client.batches.retrieve(batch.id).status == "completed"
    assert not list((server.store_dir / "expiring").rglob("file-*"))


def test_deleting_a_batch_s_outputs_deletes_the_rows_behind_them(
    serve_process: Callable[..., ServeProcess], served_model: Path, tmp_path: Path
) -> None:
    server = serve_process()
    client = server.client(server.key("team-a"))
    path = tmp_path / "in.jsonl"
    path.write_text(batch_line("a", model=str(served_model), max_tokens=4) + "\n" + batch_line("b", temperature=-1) + "\n")
    upload = client.files.create(file=path.open("rb"), purpose="batch")
    batch = wait_batch(client, client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                                     completion_window="24h").id)  # fmt: skip
    assert batch.output_file_id and batch.error_file_id
    shards = server.store_dir / "tenants" / "team-a" / "jobs" / batch.id / "shards"
    client.files.delete(batch.output_file_id)
    assert any(shards.iterdir())  # the error file still carries rows of the job
    client.files.delete(batch.error_file_id)
    assert not shards.exists() or not any(shards.iterdir())
    client.files.delete(upload.id)  # a finished batch's input may go


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
