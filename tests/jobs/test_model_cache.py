"""The S3 model cache: a second use is the cached copy; least recently used copies make room for a new
model within the byte budget; a copy used within the grace period is never removed."""

from __future__ import annotations

import os
import time
from pathlib import Path

from jobs.model_cache import COMPLETE, EVICT_GRACE_S, make_room, resolve_model
from jobs.settings import Settings
from jobs.storage import open_store


def _fake_copy(models: Path, name: str, size: int, used_ago: float) -> Path:
    entry = models / name
    entry.mkdir(parents=True)
    (entry / "model.safetensors").write_bytes(b"\0" * size)
    stamp = entry / COMPLETE
    stamp.write_text("s3://somewhere\n")
    when = time.time() - used_ago
    os.utime(stamp, (when, when))
    return entry


def test_make_room_removes_least_recently_used_first(tmp_path: Path) -> None:
    models = tmp_path / "models"
    oldest = _fake_copy(models, "a", 4000, used_ago=3 * EVICT_GRACE_S)
    older = _fake_copy(models, "b", 4000, used_ago=2 * EVICT_GRACE_S)
    recent = _fake_copy(models, "c", 4000, used_ago=10)
    (models / ".tmp-d-1234").mkdir()  # a download in progress: not a copy

    assert make_room(models, need=1000, budget=20_000) == []  # fits: nothing goes
    assert make_room(models, need=5000, budget=15_000) == [oldest]  # 12k held + 5k > 15k: one goes
    assert older.is_dir() and recent.is_dir()
    # more than the budget can ever hold: everything past the grace period goes, the recent copy stays
    assert make_room(models, need=50_000, budget=15_000) == [older]
    assert recent.is_dir() and (models / ".tmp-d-1234").is_dir()
    assert sorted(p.name for p in models.iterdir()) == [".tmp-d-1234", "c"]


def test_s3_model_is_cached_and_an_old_copy_makes_room(
    tmp_path: Path, demo_model_dir: Path, s3_env: Settings
) -> None:
    settings = s3_env.model_copy(update={"cache_dir": tmp_path / "cache"})
    size = sum(f.stat().st_size for f in demo_model_dir.iterdir())
    stale = _fake_copy(settings.cache_dir / "models", "stale", 3 * size, used_ago=2 * EVICT_GRACE_S)
    prefix = f"s3://freight-test/{tmp_path.name}/model"
    store = open_store(prefix, settings)
    for f in demo_model_dir.iterdir():
        store.put(f.name, f.read_bytes())

    roomy = resolve_model(prefix, settings.model_copy(update={"model_cache_bytes": 10 * size}))
    assert stale.is_dir() and (roomy / "config.json").read_bytes() == (demo_model_dir / "config.json").read_bytes()
    first_use = (roomy / COMPLETE).stat().st_mtime
    os.utime(roomy / COMPLETE, (first_use - 100, first_use - 100))
    assert resolve_model(prefix, settings) == roomy  # the cached copy, stamped as used now
    assert (roomy / COMPLETE).stat().st_mtime > first_use - 100

    store.put("extra.json", b"{}")  # the prefix's content changed: a new copy is needed
    tight = settings.model_copy(update={"model_cache_bytes": 5 * size})
    fresh = resolve_model(prefix, tight)
    assert fresh != roomy and (fresh / "extra.json").is_file()
    assert not stale.exists() and roomy.is_dir()  # the stale copy made room; the recent one stayed
