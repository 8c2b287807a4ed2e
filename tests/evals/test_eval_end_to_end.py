"""A real suite on the demo model through `freight eval run` (embedded), twice: identical scores,
per-row correctness in the results, and a second report that compares against the first.
Then the beat path: the scheduler's submit and collect handlers run a suite into `output`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from eval_workdir import freight, make_workdir, suite_text

from jobs.evals.beat import PENDING_PREFIX, make_handlers
from jobs.evals.collect import EvalIncompleteError, collect, read_scores
from jobs.evals.history import History
from jobs.evals.plan import job_specs, read_plan, start_run
from jobs.evals.schedule import COLLECT_TASK, SUBMIT_TASK
from jobs.evals.suite_loader import load_suite_file
from jobs.model_fingerprint import hash_checkpoint
from jobs.settings import Settings
from jobs.spec import JobSpec
from jobs.storage import LocalStore

SUITES = suite_text(
    "mixed",
    "data/mixed.parquet",
    """\
id_column = "id"
schedule = "0 3 * * *"

[suite.sampling]
max_tokens = 6

[[suite.metrics]]
type = "numeric"
extract = "first"

[[suite.metrics]]
type = "regex"
name = "mentions_answer"

[[suite.metrics]]
type = "multiple_choice"
choices_column = "options"
reference_column = "correct"
""",
    output="scheduled",
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    words = ["cold", "down", "night", "slow", "dry", "empty"]
    table = pa.table(
        {
            "id": [f"q{i}" for i in range(6)],
            "prompt": [f"Question {i}: {i} + {i} =" for i in range(6)],
            "answer": [str(2 * i) for i in range(6)],
            "options": [[words[i], words[(i + 1) % 6], words[(i + 2) % 6]] for i in range(6)],
            "correct": [i % 3 for i in range(6)],
        }
    )
    return make_workdir(tmp_path_factory.mktemp("evals-e2e"), SUITES, "data/mixed.parquet", table)


@pytest.fixture(scope="module")
def first_run(workdir: Path) -> tuple[str, str]:
    """(OUT, printed report) of the module's first embedded run of SUITES."""
    out = str(workdir / "run1")
    code, markdown = freight("eval", "run", str(workdir / "suites.toml"), "--output", out)
    assert code == 0, markdown
    return out, markdown


def _busy_seconds(spec: JobSpec) -> float:
    """The engine's busy seconds in a job's cost.json."""
    return float(json.loads((Path(spec.output) / "cost.json").read_text())["busy_seconds"])


def test_eval_run_twice_gives_identical_scores_and_a_comparing_report(
    workdir: Path, first_run: tuple[str, str]
) -> None:
    (out1, first_md), out2 = first_run, str(workdir / "run2")
    assert "first run" in first_md and "| mixed |" in first_md
    code, second_md = freight("eval", "run", str(workdir / "suites.toml"), "--output", out2)
    assert code == 0, second_md

    model = str(workdir / "model")
    first, second = read_scores(out1, "mixed", model), read_scores(out2, "mixed", model)
    columns = [
        "id",
        "completion",
        "numeric",
        "mentions_answer",
        "multiple_choice",
        "multiple_choice_norm",
        "error",
    ]
    assert first.select(columns).equals(second.select(columns))  # seeds: same rows, same scores
    assert first.num_rows == 6 and first.column("error").null_count == 6
    for name in ("numeric", "mentions_answer", "multiple_choice", "multiple_choice_norm"):
        assert set(first.column(name).to_pylist()) <= {0.0, 1.0}

    # per-row correctness agrees with the metrics applied to the stored completions
    for row in first.to_pylist():
        assert row["mentions_answer"] == (1.0 if re.search(row["reference"], row["completion"]) else 0.0)

    run1, run2 = read_plan(out1).run_id, read_plan(out2).run_id
    report = json.loads((Path(out2) / "report.json").read_text())
    assert report["run_id"] == run2 and report["regressions"] == 0
    (entry,) = report["entries"]
    assert entry["rows"] == 6 and entry["rows_failed"] == 0 and entry["cost_usd"] > 0
    assert not entry["dataset_changed"]
    for metric in entry["metrics"]:
        assert metric["previous_run_id"] == run1
        assert metric["delta"] == 0.0 and metric["regression"] is False
        assert metric["noise_method"] == "paired" and metric["noise"] == 0.0  # same rows, same scores
        assert metric["low"] <= metric["score"] <= metric["high"]
    assert entry["chart"] and (Path(out2) / entry["chart"]).read_bytes().startswith(b"\x89PNG")
    assert "+0.0 (noise" in second_md
    # the second night reuses every answer of the first from the suites' result cache (by default
    # beside the history), and the report says so
    first_entry = json.loads((Path(out1) / "report.json").read_text())["entries"][0]
    assert first_entry["job_rows"] == 6 + 18 and first_entry["job_rows_reused"] == 0  # 6 rows, 3 options each
    assert entry["job_rows"] == 24 and entry["job_rows_reused"] == 24
    assert "Reused: 24 of 24 job rows" in second_md
    # every answer reused: the second night's jobs did no engine work (their cost is the shards' wall
    # time alone, which on a tiny model is as small as the first night's, so costs are not compared)
    assert [_busy_seconds(spec) > 0 for spec in job_specs(read_plan(out1))] == [True, True]
    assert [_busy_seconds(spec) for spec in job_specs(read_plan(out2))] == [0.0, 0.0]
    assert (workdir / "history" / "result-cache" / "freight-result-cache.json").exists()

    history = History(LocalStore(workdir / "history"))
    assert [r.run_id for r in history.runs("mixed", model)] == [run1, run2]
    # each run names the checkpoint it scored by content (its jobs' result cache computed it)
    assert {r.model_fingerprint for r in history.runs("mixed", model)} == {hash_checkpoint(workdir / "model")}

    code, again = freight("eval", "report", out2)  # idempotent: same record, same report
    assert code == 0 and again.strip() == second_md.strip()
    code, raw = freight("eval", "report", out2, "--json")
    assert code == 0 and json.loads(raw)["run_id"] == run2


def test_bad_suite_file_fails_before_any_work(workdir: Path) -> None:
    bad = workdir / "bad.toml"
    bad.write_text(SUITES.replace('type = "numeric"', 'type = "numerc"'))
    code, output = freight("eval", "run", str(bad), "--output", str(workdir / "never"))
    line = SUITES.splitlines().index('type = "numeric"') + 1
    assert code == 2 and f"bad.toml:{line}:" in output and "did you mean 'numeric'" in output
    assert not (workdir / "never").exists()
    code, output = freight(
        "eval",
        "run",
        str(workdir / "suites.toml"),
        "--model",
        "/no/such/model",
        "--output",
        str(workdir / "never"),
    )
    assert code == 2 and "/no/such/model has no config.json" in output
    assert not (workdir / "never").exists()  # a missing model is found before anything is written
    code, output = freight("eval", "report", str(workdir / "nothing-here"))
    assert code == 2 and "holds no eval run" in output


def test_beat_handlers_submit_then_collect(workdir: Path) -> None:
    from freight_cli.evals import embedded_executor

    handlers = make_handlers(embedded_executor(Settings()))  # the fleet's client in production
    suites = str(workdir / "suites.toml")
    handlers[SUBMIT_TASK](suites, "mixed")
    pending = LocalStore(workdir / "scheduled")
    (marker,) = pending.list(PENDING_PREFIX)
    output = json.loads(pending.get(marker))["output"]
    assert Path(output).parent == workdir / "scheduled" / "mixed"
    handlers[COLLECT_TASK](suites)
    assert pending.list(PENDING_PREFIX) == []
    report = json.loads((Path(output) / "report.json").read_text())
    assert report["run_id"] == read_plan(output).run_id and report["entries"][0]["rows"] == 6
    history = History(LocalStore(workdir / "history"))
    assert report["run_id"] in [r.run_id for r in history.runs("mixed", str(workdir / "model"))]


def test_chat_suite_selected_by_name_on_another_model(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """messages_column goes through the chat template; --suite picks one suite, --model replaces
    the suite's models (a relative path is taken from the current folder)."""
    from worker.demo_model import make_demo_model

    other = make_demo_model(tmp_path / "other", "qwen3", seed=2)
    pq.write_table(
        pa.table(
            {
                "messages": [[{"role": "user", "content": f"Say {w}."}] for w in ("yes", "no", "maybe")],
                "reference": ["yes", "no", "maybe"],
            }
        ),
        workdir / "data" / "chat.parquet",
    )
    text = SUITES + (
        '\n[[suite]]\nname = "chat"\ndataset = "data/chat.parquet"\nmessages_column = "messages"\n'
        'models = ["model"]\nsampling = { max_tokens = 4 }\nmetrics = [{ type = "regex", pattern = "(.+)", group = 1 }]\n'
    )
    (workdir / "chat-suites.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    out = str(tmp_path / "chat-run")
    code, output = freight(
        "eval",
        "run",
        str(workdir / "chat-suites.toml"),
        "--suite",
        "chat",
        "--model",
        "other",
        "--output",
        out,
    )
    assert code == 0, output
    (planned,) = read_plan(out).suites
    assert planned.name == "chat" and [m.model for m in planned.models] == [str(other)]
    scores = read_scores(out, "chat", str(other))
    assert scores.num_rows == 3 and scores.column("error").null_count == 3
    assert all(c is not None for c in scores.column("completion").to_pylist())
    code, output = freight(
        "eval", "run", str(workdir / "chat-suites.toml"), "--suite", "nope", "--output", out + "x"
    )
    assert code == 2 and "no suite named 'nope'" in output and "its suites: mixed, chat" in output


def test_rerun_into_the_same_output_resumes_and_another_run_is_refused(
    workdir: Path, first_run: tuple[str, str]
) -> None:
    out, first = first_run
    run_id = read_plan(out).run_id
    code, again = freight(
        "eval", "run", str(workdir / "suites.toml"), "--output", out
    )  # jobs complete: nothing recomputed
    assert code == 0 and read_plan(out).run_id == run_id and again == first
    other = workdir / "other-suites.toml"
    other.write_text(SUITES.replace("max_tokens = 6", "max_tokens = 7"))
    code, output = freight("eval", "run", str(other), "--output", out)
    assert code == 2 and f"already holds eval run {run_id}" in output
    code, output = freight("eval", "run", str(workdir / "suites.toml"), "--output", str(workdir / "data"))
    assert code == 2 and "already holds other files" in output


def test_a_job_that_ended_with_a_failed_shard_scores_its_rows_as_failed(
    workdir: Path, tmp_path: Path
) -> None:
    """As on the fleet when a poison shard is given up: the job ends with failures.json and no
    _SUCCESS. The report waits until then, and the shard's rows count as failed rows."""
    from jobs.markers import write_failure, write_failures_manifest
    from jobs.planner import prepare_job
    from worker.local import load_engine
    from worker.shard import run_shard

    suites = workdir / "sharded.toml"
    suites.write_text(  # its own history: the other tests count the records of "mixed"
        f'history = "{tmp_path / "history"}"\n[[suite]]\nname = "mixed"\ndataset = "data/mixed.parquet"\nmodels = ["model"]\n'
        'reference_column = "answer"\nid_column = "id"\nshard_rows = 2\nsampling = { max_tokens = 2 }\n'
        'metrics = [{ type = "numeric" }]\n'
    )
    given_up = []

    def run_all_but_the_last_shard(spec: JobSpec) -> None:
        prepared = prepare_job(spec)
        engine, _ = load_engine(prepared.manifest)
        *good, last = prepared.manifest.shards
        for shard in good:
            assert run_shard(engine, prepared.store, prepared.manifest, shard.index).status == "committed"
        given_up.append((prepared, last))

    out = str(tmp_path / "run")
    start_run(load_suite_file(suites), out, run_all_but_the_last_shard)
    with pytest.raises(EvalIncompleteError, match="not finished yet"):
        collect(out)
    ((prepared, last),) = given_up
    write_failure(
        prepared.store,
        {
            "job_id": prepared.manifest.job_id,
            "shard": last.index,
            "rows": last.rows,
            "attempts": 3,
            "reason": "worker killed",
            "at": 0,
        },
    )
    write_failures_manifest(prepared.store, prepared.manifest.job_id)

    report = collect(out)
    (entry,) = report.entries
    scores = read_scores(out, "mixed", str(workdir / "model"))
    lost = [row for row in scores.to_pylist() if row["error"] is not None]
    assert entry.rows == 6 and entry.rows_failed == last.rows == len(lost) >= 1
    assert all(row["error"] == "no generation result for this row" and row["numeric"] == 0.0 for row in lost)
    assert entry.cost_usd > 0  # the committed shards' costs, without a cost.json
