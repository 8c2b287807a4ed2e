"""The semantic cache on a small paraphrase set: a row whose prompt's embedding (freight's own
embedder) is at least the threshold similar to a cached prompt of the same settings takes that
answer, marked semantic with the similarity and the source row; below the threshold it is computed."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pipeline_data import write_parquet

from jobs import datasets
from jobs.planner import prepare_job
from jobs.result_cache.options import CacheOptions, write_cache_options
from jobs.spec import JobSpec, SamplingSpec
from worker.local import run_local

CACHED = ["What is 17 plus 25?", "Name the capital of France.", "How many days are in three weeks?",
          "Sort the list 3, 1, 2 in order."]  # fmt: skip
ASKED = ["What is 17 plus 25 ?", "Name the capital of Spain.", "How many days are in three week?",
         "Sort the list 3, 1, 2 in order.", "Write a poem about the sea."]  # fmt: skip


@pytest.fixture(scope="module")
def embed_model(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from worker.demo_model import add_pooling_config

    folder = tmp_path_factory.mktemp("embedder") / "m"
    shutil.copytree(demo_model_dir, folder)
    return add_pooling_config(folder, "mean", normalize=True)


def _job(tmp: Path, model: Path, name: str, prompts: list[str], options: CacheOptions) -> dict[str, dict[str, Any]]:
    data = write_parquet(pa.table({"id": [f"{name}{i}" for i in range(len(prompts))], "prompt": prompts}),
                         tmp / f"{name}.parquet")  # fmt: skip
    spec = JobSpec(input=str(data), model=str(model), output=str(tmp / name), id_column="id",
                   sampling=SamplingSpec(max_tokens=4))  # fmt: skip
    prepared = prepare_job(spec)
    write_cache_options(prepared.store, options)
    run = run_local(prepared.store, prepared.manifest)
    assert run.report is not None
    return {r["id"]: r for r in datasets.read_results(prepared.store).to_pylist()} | {"_report": run.report}


def test_semantic_hits_above_the_threshold_and_misses_below(tmp_path: Path, demo_model_dir: Path, embed_model: Path) -> None:
    from worker.engine import Engine, EngineConfig

    embedder = Engine.from_pretrained(embed_model, EngineConfig(device="cpu", kv_cache_bytes=16 << 20))
    cached = np.stack([o.embedding for o in embedder.embed(CACHED)])
    asked = np.stack([o.embedding for o in embedder.embed(ASKED)])
    sims = asked @ cached.T  # normalized: cosine
    nearest, best = sims.argmax(1), sims.max(1)
    distinct = sorted(set(np.round(best[[0, 1, 2, 4]], 6)))
    threshold = float((distinct[1] + distinct[2]) / 2)  # between two of the paraphrases' similarities
    cache = str(tmp_path / "cache")
    options = CacheOptions(url=cache, semantic_threshold=threshold, embed_model=str(embed_model))
    first = _job(tmp_path, demo_model_dir, "a", CACHED, options)
    assert first["_report"]["result_cache_entries_written"] == len(CACHED)
    second = _job(tmp_path, demo_model_dir, "b", ASKED, options)

    exact = second["b3"]  # the same prompt: an exact hit, not a semantic one
    assert exact["cached"] == "exact" and exact["cached_from_row"] == "a3"
    semantic = 0
    for i in (0, 1, 2, 4):
        row = second[f"b{i}"]
        if best[i] >= threshold:
            semantic += 1
            source = f"a{nearest[i]}"
            assert row["cached"] == "semantic" and row["cached_from_row"] == source
            assert row["cached_similarity"] == pytest.approx(best[i], abs=1e-4)
            assert row["completion"] == first[source]["completion"]  # the similar prompt's answer
        else:
            assert row["cached"] is None and row["cached_similarity"] is None
    assert 1 <= semantic <= 3  # the threshold splits the set
    report = second["_report"]
    assert report["result_cache_hits"] == semantic + 1 and report["result_cache_semantic_hits"] == semantic


def test_no_semantic_hit_across_settings(tmp_path: Path, demo_model_dir: Path, embed_model: Path) -> None:
    """A near-copy of a cached prompt under another max_tokens is another group: never compared;
    under the same settings it hits."""
    options = CacheOptions(url=str(tmp_path / "cache"), semantic_threshold=0.5, embed_model=str(embed_model))
    _job(tmp_path, demo_model_dir, "c", CACHED, options)
    data = write_parquet(pa.table({"id": ["d0", "d1"], "prompt": [CACHED[0] + " ", CACHED[0] + "  "],
                                   "max_tokens": [3, 4]}), tmp_path / "d.parquet")  # fmt: skip
    spec = JobSpec(input=str(data), model=str(demo_model_dir), output=str(tmp_path / "d"), id_column="id",
                   sampling=SamplingSpec(max_tokens=4))  # fmt: skip
    prepared = prepare_job(spec)
    write_cache_options(prepared.store, options)
    run = run_local(prepared.store, prepared.manifest)
    assert run.report is not None and run.report["result_cache_semantic_hits"] == 1
    rows = {r["id"]: r for r in datasets.read_results(prepared.store).to_pylist()}
    assert rows["d0"]["cached"] is None and rows["d1"]["cached"] == "semantic" and rows["d1"]["cached_from_row"] == "c0"
