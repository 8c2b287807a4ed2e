"""A real regression end to end (slow): the model at a path is replaced by a worse one overnight.

The dataset's answers are set to what model A prefers (A scores 100%); model B, written to the same
path, disagrees on some questions. The second night's report flags the drop as a regression
(paired noise: the same rows both nights), and `freight eval run` exits 1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from eval_workdir import freight, make_workdir, suite_text

from jobs.evals.plan import read_plan
from jobs.evals.scoring import read_job_results
from jobs.storage import open_store

WORDS = ["red", "blue", "green", "cold", "warm", "night", "day", "fast", "slow", "dry", "wet", "up"]
SUITE = suite_text(
    "prefs", "data.parquet", 'metrics = [{ type = "multiple_choice", choices_column = "options" }]\n'
)


def _run(suites: Path, out: Path) -> tuple[int, str]:
    return freight("eval", "run", str(suites), "--output", str(out))


@pytest.mark.slow
def test_a_worse_model_at_the_same_path_is_flagged(tmp_path: Path) -> None:
    from worker.demo_model import make_demo_model

    questions = [
        (f"Word {i}: the colour is", [WORDS[i % 12], WORDS[(i + 5) % 12], WORDS[(i + 7) % 12]])
        for i in range(24)
    ]
    table = {
        "prompt": [q for q, _ in questions],
        "options": [o for _, o in questions],
        "answer": [0] * len(questions),
    }
    make_workdir(tmp_path, SUITE, "data.parquet", pa.table(table), seed=10)

    # what model A prefers becomes the right answer
    code, output = _run(tmp_path / "suites.toml", tmp_path / "probe")
    assert code == 0, output
    spec = read_plan(str(tmp_path / "probe")).suites[0].models[0].likelihood
    job = read_job_results(open_store(spec.output)).to_pydict()
    logprob = dict(zip(job["id"], job["continuation_logprob"], strict=True))
    table["answer"] = [max(range(3), key=lambda k, i=i: logprob[f"{i}#{k}"]) for i in range(len(questions))]
    pq.write_table(pa.table(table), tmp_path / "data.parquet")

    code, output = _run(tmp_path / "suites.toml", tmp_path / "night1")
    assert code == 0, output
    night1 = json.loads((tmp_path / "night1" / "report.json").read_text())["entries"][0]["metrics"][0]
    assert night1["score"] == 1.0

    shutil.rmtree(tmp_path / "model")
    make_demo_model(tmp_path / "model", "llama", seed=11)  # the same path, other weights
    code, output = _run(tmp_path / "suites.toml", tmp_path / "night2")
    assert code == 1, output  # a regression
    report = json.loads((tmp_path / "night2" / "report.json").read_text())
    metric = report["entries"][0]["metrics"][0]
    assert report["regressions"] == 1 and metric["regression"] and metric["noise_method"] == "paired"
    assert metric["delta"] < -metric["noise"] < 0 and metric["score"] < 1.0
    assert "**REGRESSION**" in output
