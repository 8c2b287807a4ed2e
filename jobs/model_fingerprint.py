"""A checkpoint's content fingerprint: the sha256 of its files, computed once per checkpoint.

The result cache keys answers on it (docs/design/result-cache.md): a checkpoint replaced at the same
path gets a new fingerprint, so none of the old answers are served for it. Every file of the folder
counts (weights, config.json, tokenizer files: each can change an answer), by relative path, size and
bytes; names starting with "." do not (the model cache's stamps).

Hashing reads every byte (about a second per GB), so the result is kept in the profile store, beside
the model's throughput profiles (`fingerprint|<folder>`), with each file's size and modification
time: a later job stats the files, and hashes again only when one of them changed.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from jobs.log import get_logger
from jobs.profile_store import ProfileStore
from jobs.settings import Settings

log = get_logger(__name__)
CHUNK = 8 << 20


def _files(model_dir: Path) -> list[Path]:
    out = []
    for root, dirs, names in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        out.extend(Path(root) / n for n in sorted(names) if not n.startswith("."))
    return sorted(out, key=lambda p: p.relative_to(model_dir).as_posix())


def _signature(model_dir: Path, files: list[Path]) -> list[list[Any]]:
    """[relative path, size, mtime_ns] per file: what says a file may have changed."""
    sig = []
    for f in files:
        st = f.stat()
        sig.append([f.relative_to(model_dir).as_posix(), st.st_size, st.st_mtime_ns])
    return sig


def hash_checkpoint(model_dir: Path) -> str:
    """sha256 over every file's relative path, size and bytes, in path order ("sha256:<hex>")."""
    h = hashlib.sha256(b"freight-checkpoint/1\0")
    for f in _files(model_dir):
        h.update(f"{f.relative_to(model_dir).as_posix()}\0{f.stat().st_size}\0".encode())
        with f.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
    return "sha256:" + h.hexdigest()


def model_fingerprint(model_dir: str | Path, settings: Settings) -> str:
    """The fingerprint of the checkpoint folder `model_dir`, from the profile store when its files
    are unchanged since it was computed, else computed and kept there."""
    folder = Path(model_dir).resolve()
    store = ProfileStore.for_settings(settings)
    signature = _signature(folder, _files(folder))
    kept = store.fingerprint(str(folder))
    if kept is not None and kept.get("files") == signature and isinstance(kept.get("sha256"), str):
        return kept["sha256"]
    fingerprint = hash_checkpoint(folder)
    try:
        store.put_fingerprint(str(folder), {"files": signature, "sha256": fingerprint})
    except OSError as exc:  # computed again next time
        log.warning("fingerprint_not_kept", model=str(folder), error=str(exc))
    return fingerprint
