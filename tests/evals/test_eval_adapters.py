"""An eval suite over two LoRA adapters of the demo model (peft-made), through `freight eval run`:
the model and each adapter run the suite in the model's one generation job and one likelihood job
(rows replicated per adapter), each adapter's answers are what the engine gives it alone, and the
report scores each, compares each adapter with its model on the same rows, and splits the cost."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from eval_workdir import freight, make_workdir, suite_text

from jobs.evals.collect import read_scores
from jobs.evals.history import History
from jobs.storage import LocalStore

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from tiny_adapters import make_adapter  # noqa: E402

pytest.importorskip("peft")
PROMPTS = ["def add(a, b):", "class Queue:", "import os\n", "for i in range(3):"]
SUITES = suite_text(
    "qa",
    "data/qa.parquet",
    """\
id_column = "id"
adapters = { alpha = "adapters/alpha", "beta.v2" = "adapters/beta" }
sampling = { max_tokens = 5 }

[[suite.metrics]]
type = "contains"

[[suite.metrics]]
type = "multiple_choice"
choices_column = "options"
reference_column = "correct"
""",
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import transformers

    words = ["return", "self", "None", "print"]
    table = pa.table({
        "id": [f"q{i}" for i in range(len(PROMPTS))],
        "prompt": PROMPTS,
        "answer": ["return", "def", "import", "print"],
        "options": [[words[i], words[(i + 1) % 4]] for i in range(len(PROMPTS))],
        "correct": [0, 1, 0, 1],
    })  # fmt: skip
    root = make_workdir(tmp_path_factory.mktemp("evals-lora"), SUITES, "data/qa.parquet", table)
    base = transformers.AutoModelForCausalLM.from_pretrained(root / "model").float().eval()
    make_adapter(base, root / "adapters" / "alpha", rank=8, seed=1, scale=0.3)
    make_adapter(base, root / "adapters" / "beta", rank=16, seed=2, scale=0.3, targets=("q_proj", "v_proj"))
    return root


def test_every_adapter_runs_the_suite_in_one_job_and_the_report_compares_them(workdir: Path) -> None:
    from worker.engine import Engine, EngineConfig, SamplingParams

    out = workdir / "run"
    code, markdown = freight("eval", "run", str(workdir / "suites.toml"), "--output", str(out))
    assert code == 0, markdown
    model = str(workdir / "model")
    names = [None, "alpha", "beta.v2"]
    report = json.loads((out / "report.json").read_text())
    assert [e["adapter"] for e in report["entries"]] == names
    # one generation and one likelihood job for the model and both adapters
    (folder,) = [p for p in (out / "qa").iterdir() if p.is_dir() and "+" not in p.name]
    assert sorted(p.name for p in folder.iterdir() if (p / "manifest.json").exists()) == ["generate", "likelihood"]

    engine = Engine.from_pretrained(workdir / "model", EngineConfig(kv_cache_bytes=16 << 20))
    engine.set_loras({"alpha": workdir / "adapters" / "alpha", "beta.v2": workdir / "adapters" / "beta"})
    completions = {}
    for name, entry in zip(names, report["entries"], strict=True):
        assert entry["rows"] == len(PROMPTS) and entry["rows_failed"] == 0 and entry["cost_usd"] > 0
        scores = read_scores(str(out), "qa", model, name)
        outs = engine.generate(PROMPTS, SamplingParams(max_tokens=5, temperature=0.0, seed=0),
                               adapters=[name] * len(PROMPTS))  # fmt: skip
        assert scores.column("id").to_pylist() == [f"q{i}" for i in range(len(PROMPTS))]
        assert scores.column("completion").to_pylist() == [o.text for o in outs], name
        completions[name] = scores.column("completion").to_pylist()
        history = History(LocalStore(workdir / "history")).runs("qa", model, name)
        assert [r.adapter for r in history] == [name] and history[0].rows == len(PROMPTS)
    assert completions["alpha"] != completions[None] and completions["beta.v2"] != completions[None]

    # each adapter's option log-probabilities are its own
    likelihood = pa.concat_tables([pq.read_table(p) for p in sorted((folder / "likelihood" / "shards").glob("*.parquet"))])
    by_adapter: dict[str | None, list[float]] = {}
    for row in sorted(likelihood.to_pylist(), key=lambda r: r["id"]):
        by_adapter.setdefault(row["adapter"], []).append(row["continuation_logprob"])
    assert len(by_adapter) == 3 and len({tuple(v) for v in by_adapter.values()}) == 3

    # the model's entry carries no comparison; each adapter's compares every metric with the model's
    assert report["entries"][0]["against_model"] == []
    for entry in report["entries"][1:]:
        model_scores = {m["metric"]: m["score"] for m in report["entries"][0]["metrics"]}
        compared = entry["against_model"]
        assert [c["metric"] for c in compared] == ["contains", "multiple_choice", "multiple_choice_norm"]
        for c in compared:
            assert c["model_score"] == model_scores[c["metric"]]
            assert c["delta"] == pytest.approx(c["score"] - c["model_score"])
            assert c["verdict"] in ("better", "worse", "within noise") and c["noise"] is not None
            assert f"| qa | {model} | {entry['adapter']} | {c['metric']} |" in markdown
    assert "LoRA adapters against their model" in markdown and f"| qa | {model} + alpha | contains |" in markdown

    # the jobs' cost is split between the model and its adapters
    jobs = sum(json.loads((folder / kind / "cost.json").read_text())["cost_usd"] for kind in ("generate", "likelihood"))
    assert sum(e["cost_usd"] for e in report["entries"]) == pytest.approx(jobs, rel=1e-6)


def test_bad_adapters_are_refused_before_any_work(workdir: Path) -> None:
    bad = workdir / "bad.toml"
    bad.write_text(SUITES.replace('"adapters/beta"', '"adapters/nowhere"'))
    code, output = freight("eval", "run", str(bad), "--output", str(workdir / "never"))
    assert code == 2 and "adapter beta.v2" in output and "adapter_config.json" in output, output
    assert not (workdir / "never").exists()
    bad.write_text(SUITES.replace("alpha = ", '"-alpha" = '))
    code, output = freight("eval", "run", str(bad), "--output", str(workdir / "never"))
    line = SUITES.splitlines().index(next(x for x in SUITES.splitlines() if x.startswith("adapters"))) + 1
    assert code == 2 and f"bad.toml:{line}:" in output and "adapter name '-alpha'" in output, output
    assert not (workdir / "never").exists()
