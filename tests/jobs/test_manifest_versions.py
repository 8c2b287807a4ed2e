"""A manifest this freight cannot read: written by a newer freight (a fleet mid-upgrade: nothing wrong
with the job) or damaged (the job cannot run from it). read_manifest tells them apart, and each error
says what to do. jobs/reconcile.py acts on the difference (tests/distributed/test_reconcile_storage.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.errors import CorruptManifestError, ManifestError, NewerManifestError
from jobs.manifest import MANIFEST_KEY, read_manifest
from jobs.planner import prepare_job
from jobs.spec import JobSpec
from jobs.storage import open_store


@pytest.fixture()
def rewrite(tmp_path: Path, demo_model_dir: Path) -> Callable[[Callable[[dict[str, Any]], Any]], ManifestError]:
    """Plan a job into tmp_path/out; rewrite(edit) stores edit(its manifest's JSON) and returns the error
    read_manifest raises then."""
    pq.write_table(pa.table({"prompt": ["a", "b"]}), tmp_path / "in.parquet")
    store = prepare_job(JobSpec(input=str(tmp_path / "in.parquet"), model=str(demo_model_dir),
                                output=str(tmp_path / "out"))).store  # fmt: skip
    original = json.loads(store.get(MANIFEST_KEY))

    def _rewrite(edit: Callable[[dict[str, Any]], Any]) -> ManifestError:
        raw = json.loads(json.dumps(original))
        edited = edit(raw)  # None: edited in place; else what to store (bytes as they are)
        data = edited if isinstance(edited, bytes) else json.dumps(raw if edited is None else edited).encode()
        store.put(MANIFEST_KEY, data)
        with pytest.raises(ManifestError) as info:
            read_manifest(open_store(str(tmp_path / "out")))
        assert isinstance(info.value, ValueError)  # callers that catch ValueError still catch it
        return info.value

    return _rewrite


def test_a_newer_freights_manifest_says_upgrade(rewrite: Callable[..., ManifestError]) -> None:
    newer = [
        lambda m: m.update(format="freight.manifest/2"),  # a new format version
        lambda m: m.update(retention_days=7),  # a field this version lacks
        lambda m: m["spec"].update(quantization="fp4"),  # a value this version lacks
    ]
    for edit in newer:
        err = rewrite(edit)
        assert isinstance(err, NewerManifestError), err
        assert "newer freight" in str(err) and "upgrade this freight" in str(err)
    assert "retention_days" in str(rewrite(newer[1])) and "spec.quantization" in str(rewrite(newer[2]))


def test_a_damaged_manifest_says_resubmit(rewrite: Callable[..., ManifestError]) -> None:
    damaged = {
        "is not JSON": lambda m: json.dumps(m).encode()[:40],  # cut short
        "not an object": lambda m: [m],
        "unknown format 'freight.manifest/0'": lambda m: m.update(format="freight.manifest/0"),
        "unknown format 'sharded'": lambda m: m.update(format="sharded"),
        "first: shards: Field required": lambda m: m.pop("shards") and None,
        "first: created_at: Input should be a valid number": lambda m: m.update(created_at="yesterday"),
    }
    for what, edit in damaged.items():
        err = rewrite(edit)
        assert isinstance(err, CorruptManifestError), (what, err)
        assert what in str(err) and "manifest.json" in str(err) and "new --output" in str(err), str(err)
