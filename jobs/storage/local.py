"""LocalStore: a folder as an object store. Atomic create = temp file + os.link (fails if present)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from jobs.errors import ObjectNotFoundError
from jobs.storage.base import READ_CHUNK, ObjectStore, ObjectWriter, check_key

_TMP_PREFIX = ".tmp-"


class LocalStore(ObjectStore):
    """Objects are files under `root`; temp files (".tmp-*") never show in `list`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def local_path(self, key: str) -> Path | None:
        return self._path(key)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise ObjectNotFoundError(f"{self.url_of(key)} does not exist") from exc

    def get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            with self._path(key).open("rb") as f:
                f.seek(start)
                return f.read(length)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise ObjectNotFoundError(f"{self.url_of(key)} does not exist") from exc

    def read_chunks(self, key: str, chunk: int = READ_CHUNK) -> Iterator[bytes]:
        try:
            f = self._path(key).open("rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise ObjectNotFoundError(f"{self.url_of(key)} does not exist") from exc
        with f:
            while piece := f.read(chunk):
                yield piece

    def writer(self, key: str) -> ObjectWriter:
        return _LocalWriter(self._path(key))

    def size(self, key: str) -> int:
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFoundError(f"{self.url_of(key)} does not exist")
        return path.stat().st_size

    def _write_temp(self, path: Path, data: bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f"{_TMP_PREFIX}{path.name}.{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._write_temp(path, data)
        os.replace(tmp, path)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        tmp = self._write_temp(path, data)
        try:
            os.link(tmp, path)  # atomic; fails with FileExistsError if the key exists
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.is_dir():
            return []
        base = self.root
        # walk only the deepest folder the prefix names, then filter by the string prefix
        folder, _, _ = prefix.rpartition("/")
        start = base / folder if folder else base
        if not start.is_dir():
            return []
        keys: list[str] = []
        for dirpath, _dirs, files in os.walk(start):
            rel_dir = Path(dirpath).relative_to(base).as_posix()
            for name in files:
                if name.startswith(_TMP_PREFIX):
                    continue
                key = name if rel_dir == "." else f"{rel_dir}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class _LocalWriter(ObjectWriter):
    """A temp file beside the key's path (hidden from `list`), renamed over it at commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = path.parent / f"{_TMP_PREFIX}{path.name}.{uuid.uuid4().hex}"
        self._file: BinaryIO | None = open(self.tmp, "xb")  # noqa: SIM115 (closed by commit / abort)
        self.bytes_written = 0

    def write(self, data: bytes) -> int:
        if self._file is None:
            raise ValueError(f"{self.path}: the writer is closed")
        self._file.write(data)
        self.bytes_written += len(data)
        return len(data)

    def commit(self) -> None:
        if self._file is None:
            raise ValueError(f"{self.path}: the writer is closed")
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.tmp.unlink(missing_ok=True)
