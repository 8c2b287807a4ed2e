"""ObjectStore contract on a local folder and on S3 (moto over HTTP): put_if_absent commits once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from jobs.errors import ObjectNotFoundError
from jobs.settings import Settings
from jobs.storage import LocalStore, ObjectStore, S3Store, open_store


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return open_store(str(tmp_path / "out"))
    settings: Settings = request.getfixturevalue("s3_env")
    return open_store(f"s3://freight-test/{tmp_path.name}/out", settings)


def test_put_get_list_delete(store: ObjectStore) -> None:
    assert store.list() == [] and not store.exists("a.json")
    store.put("shards/00001.json", b"one")
    store.put("shards/00000.json", b"zero")
    store.put("manifest.json", b"{}")
    store.put("shards/00001.json", b"one again")  # put replaces
    assert store.get("shards/00001.json") == b"one again"
    assert store.list("shards/") == ["shards/00000.json", "shards/00001.json"]
    assert store.list() == ["manifest.json", "shards/00000.json", "shards/00001.json"]
    store.delete("shards/00000.json")
    store.delete("shards/00000.json")  # deleting a missing key is fine
    assert store.list("shards/") == ["shards/00001.json"]
    with pytest.raises(ObjectNotFoundError):
        store.get("shards/00000.json")


def test_ranged_reads_and_sizes(store: ObjectStore) -> None:
    store.put("w/model.safetensors", bytes(range(100)))
    assert store.size("w/model.safetensors") == 100
    assert store.get_range("w/model.safetensors", 0, 8) == bytes(range(8))
    assert store.get_range("w/model.safetensors", 95, 10) == bytes(range(95, 100))  # short at the end
    assert store.get_range("w/model.safetensors", 100, 4) == b""
    with pytest.raises(ObjectNotFoundError):
        store.get_range("w/missing", 0, 8)
    with pytest.raises(ObjectNotFoundError):
        store.size("w/missing")


def test_put_if_absent_refuses_a_second_commit(store: ObjectStore) -> None:
    assert store.put_if_absent("shards/00000.parquet", b"first") is True
    assert store.put_if_absent("shards/00000.parquet", b"second") is False
    assert store.get("shards/00000.parquet") == b"first"


def test_racing_commits_have_exactly_one_winner(store: ObjectStore) -> None:
    wins: list[bytes] = []
    barrier = threading.Barrier(8)

    def commit(i: int) -> None:
        barrier.wait()
        if store.put_if_absent("shards/00007.parquet", f"worker {i}".encode()):
            wins.append(f"worker {i}".encode())

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert store.get("shards/00007.parquet") == wins[0]
    assert store.list() == ["shards/00007.parquet"]  # no temp files left visible


def test_keys_cannot_escape_the_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    for bad in ("../x", "/etc/passwd", "a//b", "a/./b"):
        with pytest.raises(ValueError):
            store.put(bad, b"x")


def test_open_store_picks_the_backend(tmp_path: Path, s3_env: Settings) -> None:
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    s3 = open_store("s3://freight-test/a/b/", s3_env)
    assert isinstance(s3, S3Store) and s3.url == "s3://freight-test/a/b"
    with pytest.raises(ValueError):
        open_store("gs://bucket/x")


def test_s3_partial_checkpoints_are_tagged_for_expiry(s3_env: Settings, tmp_path: Path) -> None:
    """The bucket's lifecycle rule expires objects tagged freight-partial=true (infra/terraform)."""
    store = open_store(f"s3://freight-test/{tmp_path.name}/out", s3_env)
    assert isinstance(store, S3Store)
    store.put("partial/00003/1.parquet", b"rows")
    store.put("shards/00003.json", b"{}")
    client, bucket = store._client, store.bucket

    def tags(key: str) -> dict[str, str]:
        got = client.get_object_tagging(Bucket=bucket, Key=f"{tmp_path.name}/out/{key}")["TagSet"]
        return {t["Key"]: t["Value"] for t in got}

    assert tags("partial/00003/1.parquet") == {"freight-partial": "true"}
    assert tags("shards/00003.json") == {}


def test_a_writer_publishes_at_commit_and_aborts_without_a_trace(store: ObjectStore) -> None:
    """Pieces written through `writer` appear under the key only at commit, whole; an exception in
    the block discards them and leaves the key as it was. 20 MiB crosses S3's multipart threshold."""
    from jobs.storage.s3 import PART_BYTES

    piece = bytes(range(256)) * 4096  # 1 MiB
    with store.writer("files/big.jsonl") as w:
        for _ in range(20):
            w.write(piece)
            assert not store.exists("files/big.jsonl")
    assert w.bytes_written == 20 * len(piece) > 2 * PART_BYTES
    assert store.size("files/big.jsonl") == 20 * len(piece)
    assert store.get("files/big.jsonl") == piece * 20
    assert b"".join(store.read_chunks("files/big.jsonl", chunk=3 << 20)) == piece * 20
    assert [len(c) for c in store.read_chunks("files/big.jsonl", chunk=3 << 20)][:2] == [3 << 20, 3 << 20]

    store.put("files/small.jsonl", b"old")
    with pytest.raises(RuntimeError), store.writer("files/small.jsonl") as w:
        w.write(piece * 10)
        raise RuntimeError("the client went away")
    assert store.get("files/small.jsonl") == b"old"
    with pytest.raises(RuntimeError), store.writer("files/never.jsonl") as w:
        w.write(b"{}\n")
        raise RuntimeError("the client went away")
    assert not store.exists("files/never.jsonl")
    assert store.list("files/") == ["files/big.jsonl", "files/small.jsonl"]  # no temp file shows
    assert store.sizes("files/") == [("files/big.jsonl", 20 * len(piece)), ("files/small.jsonl", 3)]
    with pytest.raises(ObjectNotFoundError):
        next(store.read_chunks("files/missing"))


def test_a_local_writer_leaves_no_temp_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "out")
    with pytest.raises(ValueError), store.writer("a/b.jsonl") as w:
        w.write(b"x")
        raise ValueError("stop")
    with store.writer("a/c.jsonl") as w:
        w.write(b"y")
    assert sorted(p.name for p in (tmp_path / "out" / "a").iterdir()) == ["c.jsonl"]
