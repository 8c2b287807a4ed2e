"""Models in S3: downloaded once into Settings.cache_dir, keyed by the objects' content (ETags + sizes)."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

from jobs.errors import ModelNotFoundError
from jobs.log import get_logger
from jobs.settings import Settings, get_settings
from jobs.storage import S3Store, open_store

log = get_logger(__name__)


def resolve_model(model: str, settings: Settings | None = None) -> Path:
    """A local folder holding the checkpoint: `model` itself, or its cached copy when in S3."""
    if not model.startswith("s3://"):
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"model {model} has no config.json: give a Hugging Face checkpoint folder"
            )
        return path
    settings = settings or get_settings()
    store = open_store(model, settings)
    assert isinstance(store, S3Store)  # invariant: s3:// URLs open an S3Store
    listing = store.describe()
    if "config.json" not in {key for key, _, _ in listing}:
        raise ModelNotFoundError(f"model {model} has no config.json: give a Hugging Face checkpoint prefix")
    digest = hashlib.sha256("\n".join(f"{k}\t{e}\t{s}" for k, e, s in listing).encode()).hexdigest()[:24]
    target = settings.cache_dir / "models" / digest
    if (target / ".complete").is_file():
        return target
    tmp = target.parent / f".tmp-{digest}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        for key, _, _ in listing:
            dest = tmp / key
            dest.parent.mkdir(parents=True, exist_ok=True)
            store.download(key, str(dest))
        (tmp / ".complete").write_text(model + "\n")
        try:
            os.rename(tmp, target)  # atomic; another process may have won
        except OSError:
            if not (target / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("model_cached", model=model, path=str(target), files=len(listing))
    return target
