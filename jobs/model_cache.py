"""Models in S3: downloaded once into Settings.cache_dir, keyed by the objects' content (ETags + sizes).

Each use stamps the copy's `.complete` file; before a download, copies used least recently are
removed until the new model fits: within Settings.model_cache_bytes when set, and always within the
disk's free space. A copy used in the last EVICT_GRACE_S seconds is never removed (a process may be
loading it), so the download may still find too little room and fail with the disk's own error.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from pathlib import Path

from jobs.errors import ModelNotFoundError
from jobs.log import get_logger
from jobs.settings import Settings, get_settings
from jobs.storage import S3Store, open_store

log = get_logger(__name__)
EVICT_GRACE_S = 600.0
COMPLETE = ".complete"


def resolve_model(model: str, settings: Settings | None = None) -> Path:
    """A local folder holding the checkpoint: `model` itself, or its cached copy when in S3."""
    return _resolve(model, settings, "config.json", f"model {model}", "a Hugging Face checkpoint")


def resolve_adapter(name: str, url: str, settings: Settings | None = None) -> Path:
    """A local folder holding the LoRA adapter `name` of a job: `url` itself, or its cached copy when
    in S3 (kept and evicted with the models)."""
    return _resolve(url, settings, "adapter_config.json", f"adapter {name} ({url})", "a PEFT adapter")


def _resolve(model: str, settings: Settings | None, marker: str, what: str, kind: str) -> Path:
    """`model` (a folder or s3:// prefix) as a local folder; ModelNotFoundError `what` has no `marker`."""
    if not model.startswith("s3://"):
        path = Path(model).expanduser()
        if not (path / marker).is_file():
            raise ModelNotFoundError(f"{what} has no {marker}: give {kind} folder")
        return path
    settings = settings or get_settings()
    store = open_store(model, settings)
    assert isinstance(store, S3Store)  # invariant: s3:// URLs open an S3Store
    listing = store.describe()
    if marker not in {key for key, _, _ in listing}:
        raise ModelNotFoundError(f"{what} has no {marker}: give {kind} prefix")
    digest = hashlib.sha256("\n".join(f"{k}\t{e}\t{s}" for k, e, s in listing).encode()).hexdigest()[:24]
    target = settings.cache_dir / "models" / digest
    if (target / COMPLETE).is_file():
        os.utime(target / COMPLETE)  # most recently used
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    make_room(target.parent, sum(size for _, _, size in listing), settings.model_cache_bytes)
    tmp = target.parent / f".tmp-{digest}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        for key, _, _ in listing:
            dest = tmp / key
            dest.parent.mkdir(parents=True, exist_ok=True)
            store.download(key, str(dest))
        (tmp / COMPLETE).write_text(model + "\n")
        try:
            os.rename(tmp, target)  # atomic; another process may have won
        except OSError:
            if not (target / COMPLETE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("model_cached", model=model, path=str(target), files=len(listing))
    return target


def make_room(models: Path, need: int, budget: int) -> list[Path]:
    """Remove cached copies under `models`, least recently used first, until `need` more bytes fit
    (within `budget` when non-zero, and within the disk's free space); returns the removed folders."""
    now = time.time()
    copies = []
    for entry in models.iterdir():
        stamp = entry / COMPLETE
        if entry.name.startswith(".") or not stamp.is_file():
            continue  # a download in progress, or not a cache entry
        size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        copies.append((stamp.stat().st_mtime, size, entry))
    copies.sort()
    held = sum(size for _, size, _ in copies)
    removed = []
    for used, size, entry in copies:
        too_big = budget and held + need > budget
        if not too_big and shutil.disk_usage(models).free >= need:
            break
        if now - used < EVICT_GRACE_S:
            break  # in use (or about to be): the oldest left is recent, so are the rest
        trash = models / f".evict-{entry.name}-{uuid.uuid4().hex[:8]}"
        os.rename(entry, trash)  # atomic: no process sees a half-removed copy as complete
        shutil.rmtree(trash, ignore_errors=True)
        held -= size
        removed.append(entry)
        log.info("model_evicted", path=str(entry), bytes=size, unused_s=round(now - used))
    return removed
