"""/v1/files through the official `openai` client: upload, list, retrieve, download, delete, and every
way an upload is refused, each leaving nothing behind."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx2
import openai
import pytest
from openai.types import FileDeleted, FileObject

from jobs.api.keys import create_key, revoke_key
from jobs.storage import ObjectStore
from tests.api.conftest import ThreadServer
from tests.api.serve_harness import batch_file, batch_line


def _objects(store: ObjectStore) -> list[str]:
    """Every object under tenants/, and any temp file in the store's folder."""
    root = store.local_path("x")
    assert root is not None
    return sorted(str(p.relative_to(root.parent)) for p in root.parent.rglob("*") if p.is_file()
                  and "tenants" in p.parts)  # fmt: skip


def test_upload_list_retrieve_download_delete(make_server: Callable[..., ThreadServer], key_a: str, tmp_path: Path) -> None:
    server = make_server()
    client = server.client(key_a)
    path = batch_file(tmp_path / "requests.jsonl", 3)
    before = int(time.time())
    uploaded = client.files.create(file=path.open("rb"), purpose="batch")
    assert isinstance(uploaded, FileObject)
    assert uploaded.id.startswith("file-") and uploaded.object == "file" and uploaded.purpose == "batch"
    assert uploaded.bytes == path.stat().st_size and uploaded.filename == "requests.jsonl"
    assert before <= uploaded.created_at <= int(time.time())
    assert uploaded.expires_at == uploaded.created_at + 30 * 86_400  # OpenAI's default for batch files
    assert uploaded.model_extra == {}  # nothing the SDK's type does not know

    assert client.files.retrieve(uploaded.id) == uploaded
    assert client.files.content(uploaded.id).read() == path.read_bytes()
    listed = client.files.list()
    assert [f.id for f in listed.data] == [uploaded.id] and listed.has_more is False

    deleted = client.files.delete(uploaded.id)
    assert isinstance(deleted, FileDeleted) and deleted.deleted and deleted.id == uploaded.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(uploaded.id)
    with pytest.raises(openai.NotFoundError):
        client.files.delete(uploaded.id)
    assert client.files.list().data == []
    assert _objects(server.store) == []


def test_expires_after_is_honoured_and_checked(make_server: Callable[..., ThreadServer], key_a: str, tmp_path: Path) -> None:
    client = make_server().client(key_a)
    path = batch_file(tmp_path / "r.jsonl", 1)
    f = client.files.create(file=path.open("rb"), purpose="batch", expires_after={"anchor": "created_at", "seconds": 7200})
    assert f.expires_at == f.created_at + 7200
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(file=path.open("rb"), purpose="batch", expires_after={"anchor": "created_at", "seconds": 60})
    assert bad.value.param == "expires_after.seconds" and "3600" in bad.value.message


@pytest.mark.parametrize(
    ("content", "code", "words"),
    [
        (b"id,prompt\n1,hello\n", "invalid_file_format", "line 1 is not a JSON object"),
        (batch_line("a").encode() + b"\nnot json at all\n", "invalid_file_format", "line 2 is not a JSON object"),
        (b"{not json}\n", "invalid_file_format", "line 1 is not JSON"),
        (b"\n  \n", "empty_file", "holds no request"),
        (batch_line("a").encode() + b"\n\xff\xfe{}\n", "invalid_file_format", "line 2 is not UTF-8"),
        (b"".join(batch_line(f"r{i}").encode() + b"\n" for i in range(6)), "too_many_requests", "more than 5"),
        (batch_line("a").encode() * 400, "file_too_large", "larger than this server's limit of 20,000"),
    ],
)
def test_bad_uploads_are_refused_and_leave_nothing(
    make_server: Callable[..., ThreadServer], key_a: str, tmp_path: Path, content: bytes, code: str, words: str
) -> None:
    server = make_server(max_upload_lines=5, max_upload_bytes=20_000)
    client = server.client(key_a)
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(file=path.open("rb"), purpose="batch")
    assert bad.value.code == code and bad.value.param == "file"
    assert words in bad.value.message
    assert bad.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert client.files.list().data == []
    assert _objects(server.store) == []


def test_bad_requests_get_openai_errors(make_server: Callable[..., ThreadServer], key_a: str, tmp_path: Path) -> None:
    server = make_server()
    client = server.client(key_a)
    path = batch_file(tmp_path / "r.jsonl", 1)
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(file=path.open("rb"), purpose="fine-tune")
    assert bad.value.param == "purpose" and "purpose 'batch'" in bad.value.message
    headers = {"Authorization": f"Bearer {key_a}"}
    with httpx2.Client(base_url=server.url, headers=headers) as http:
        wrong_type = http.post("/v1/files", json={"purpose": "batch"})
        no_file = http.post("/v1/files", data={"purpose": "batch"}, files={"other": ("x.txt", b"x")})
        no_purpose = http.post("/v1/files", files={"file": ("r.jsonl", path.read_bytes())})
        unknown = http.get("/v1/nothing")
        bad_limit = http.get("/v1/files", params={"limit": 0})
        health = http.get("/health", headers={"Authorization": ""})  # a load balancer's check: no key
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    for answer, status, param in ((wrong_type, 400, None), (no_file, 400, "file"), (no_purpose, 400, "purpose"),
                                  (unknown, 404, None), (bad_limit, 400, "limit")):  # fmt: skip
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["param"] == param and error["message"]
    assert "multipart/form-data" in wrong_type.json()["error"]["message"]
    assert _objects(server.store) == []


def test_a_client_that_disconnects_mid_upload_leaves_no_file(
    make_server: Callable[..., ThreadServer], key_a: str
) -> None:
    server = make_server()
    port = int(server.url.rsplit(":", 1)[1])
    boundary = "xyz"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n"
            'Content-Disposition: form-data; name="file"; filename="r.jsonl"\r\n'
            "Content-Type: application/jsonl\r\n\r\n").encode()  # fmt: skip
    body = head + (batch_line("a") + "\n").encode() * 2000  # the closing boundary never comes
    request = (f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key_a}\r\n"
               f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body) * 2}\r\n\r\n")  # fmt: skip
    root = server.store.local_path("tenants")
    assert root is not None
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request.encode() + body)
        deadline = time.monotonic() + 5  # the file streams into a temp file beside its key
        while not (root.exists() and any(p.name.startswith(".tmp-") for p in root.rglob("*"))):
            assert time.monotonic() < deadline, "the upload never reached the store"
            time.sleep(0.01)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        leftovers = [p for p in root.rglob("*") if p.is_file()]
        if not leftovers:
            break
        time.sleep(0.05)
    assert leftovers == []
    assert server.client(key_a).files.list().data == []


def test_concurrent_uploads_of_one_file_are_distinct_files(
    make_server: Callable[..., ThreadServer], key_a: str, tmp_path: Path
) -> None:
    client = make_server().client(key_a)
    path = batch_file(tmp_path / "same.jsonl", 20)
    ids: list[str] = []
    threads = [threading.Thread(target=lambda: ids.append(client.files.create(file=path.open("rb"), purpose="batch").id))
               for _ in range(6)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 6
    assert sorted(f.id for f in client.files.list().data) == sorted(ids)
    assert all(client.files.content(i).read() == path.read_bytes() for i in ids)


def test_file_pages(make_server: Callable[..., ThreadServer], key_a: str, tmp_path: Path) -> None:
    client = make_server().client(key_a)
    path = batch_file(tmp_path / "r.jsonl", 1)
    ids = [client.files.create(file=path.open("rb"), purpose="batch").id for _ in range(7)]
    newest_first = list(reversed(ids))
    page = client.files.list(limit=3)
    assert [f.id for f in page.data] == newest_first[:3] and page.has_more
    assert [f.id for f in client.files.list(limit=3)] == newest_first  # the SDK follows the cursor
    assert [f.id for f in client.files.list(limit=2, order="asc")] == ids
    assert [f.id for f in client.files.list(after=ids[2], order="asc", limit=100).data] == ids[3:]
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.list(after="file-0000000000000000000000000000")
    assert bad.value.param == "after"


def test_tenants_see_only_their_files_and_keys_need_no_restart(
    make_server: Callable[..., ThreadServer], store: ObjectStore, key_a: str, key_b: str, tmp_path: Path
) -> None:
    server = make_server()
    a, b = server.client(key_a), server.client(key_b)
    path = batch_file(tmp_path / "r.jsonl", 2)
    mine = a.files.create(file=path.open("rb"), purpose="batch")
    for call in (lambda: b.files.retrieve(mine.id), lambda: b.files.content(mine.id), lambda: b.files.delete(mine.id)):
        with pytest.raises(openai.NotFoundError) as missing:
            call()
        assert "No such file" in missing.value.message
    assert b.files.list().data == []
    with pytest.raises(openai.AuthenticationError) as bad:
        server.client("fk-not-a-key").files.list()
    assert bad.value.code == "invalid_api_key"
    with httpx2.Client(base_url=server.url) as http:
        assert http.get("/v1/files").status_code == 401
    # a key made while the server runs works at once; a revoked one stops within a second
    key_c, record = create_key(store, "team-a", name="ci")
    c = server.client(key_c)
    assert [f.id for f in c.files.list().data] == [mine.id]  # same tenant, same files
    revoke_key(store, record.key_id)
    time.sleep(1.0)
    with pytest.raises(openai.AuthenticationError):
        c.files.list()
    assert a.files.list().data  # the tenant's other key is untouched
    for key in (key_a, key_b, key_c):  # the store holds hashes only
        assert not any(key.encode() in p.read_bytes() for p in store.local_path("x").parent.rglob("*") if p.is_file())  # type: ignore[union-attr]


def test_a_tenant_over_its_storage_limit_gets_429(
    make_server: Callable[..., ThreadServer], key_a: str, key_b: str, tmp_path: Path
) -> None:
    from jobs.api.tenants import write_limits

    server = make_server()
    path = batch_file(tmp_path / "r.jsonl", 10)
    size = path.stat().st_size
    write_limits(server.store, "team-a", {"max_stored_bytes": int(size * 2.5)})
    a = server.client(key_a)
    a.files.create(file=path.open("rb"), purpose="batch")
    a.files.create(file=path.open("rb"), purpose="batch")
    with pytest.raises(openai.RateLimitError) as over:
        a.files.create(file=path.open("rb"), purpose="batch")
    assert over.value.code == "storage_limit_exceeded" and over.value.response.headers["x-should-retry"] == "false"
    assert len(a.files.list().data) == 2
    server.client(key_b).files.create(file=path.open("rb"), purpose="batch")  # another tenant's budget
    assert json.loads(server.store.get("tenants/team-a/limits.json")) == {"max_stored_bytes": int(size * 2.5)}


def test_the_input_of_an_unfinished_batch_cannot_be_deleted(
    make_server: Callable[..., ThreadServer], key_a: str, tmp_path: Path
) -> None:
    client = make_server().client(key_a)  # no batch process: the batch stays validating
    upload = client.files.create(file=batch_file(tmp_path / "r.jsonl", 2).open("rb"), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError) as busy:
        client.files.delete(upload.id)
    assert busy.value.code == "file_in_use" and batch.id in busy.value.message
    assert client.files.retrieve(upload.id).id == upload.id
