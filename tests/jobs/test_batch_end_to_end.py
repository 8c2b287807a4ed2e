"""The request surface end to end on the tiny demo model: an OpenAI-Batch file mixing chat, completions,
embeddings and bad lines; Parquet sampling columns and job flags; resume with the new result columns."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from freight_runner import freight
from pipeline_data import write_parquet

from jobs import datasets
from jobs.manifest import partial_key, shard_result_key
from jobs.planner import prepare_job
from jobs.spec import JobSpec, SamplingSpec
from worker.engine import SamplingParams
from worker.shard import run_shard

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "sort a list"}]


@pytest.fixture(scope="module")
def model_dir(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo checkpoint (same folder name) with a pooling config, so embeddings lines run too."""
    from worker.demo_model import add_pooling_config

    out = tmp_path_factory.mktemp("pooled") / demo_model_dir.name
    shutil.copytree(demo_model_dir, out)
    return add_pooling_config(out)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Any:
    from worker.engine import Engine, EngineConfig

    return Engine.from_pretrained(model_dir, EngineConfig(device="cpu", kv_cache_bytes=64 << 20))


def _results(out: Path) -> dict[str, dict[str, Any]]:
    table = ds.dataset(out / "shards").to_table()
    assert table.schema == datasets.result_schema(likelihood=False)
    return {r["id"]: r for r in table.to_pylist()}


def _greedy(engine: Any, prompt: str, max_tokens: int) -> str:
    (out,) = engine.generate([prompt], SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return out.text


def _stop_in(text: str, start: int = 1) -> tuple[str, int]:
    """A one-character stop string first seen at index k >= `start` of `text`, and k."""
    for k in range(max(1, start), len(text)):
        if text[k].strip() and text[k] not in text[:k]:
            return text[k], k
    raise AssertionError(f"no usable stop character in {text!r}")


@pytest.mark.slow
def test_a_mixed_batch_file_runs_with_each_bad_line_its_own_error(
    tmp_path: Path, model_dir: Path, engine: Any
) -> None:
    ref = _greedy(engine, engine.tokenizer.apply_chat_template(MESSAGES), 12)
    stop, cut = _stop_in(ref)
    parts = [MESSAGES[0], {"role": "user", "content": [{"type": "text", "text": "sort a list"}]}]
    good = {
        "chat": {"messages": parts, "max_tokens": 12, "ignore_eos": True},  # text parts == plain content
        "chat-stop": {"model": "tiny", "messages": MESSAGES, "max_tokens": 12, "stop": [stop], "ignore_eos": True},
        "chat-n": {"messages": MESSAGES, "n": 2, "temperature": 1.0, "seed": 3, "max_tokens": 4},
        "comp": {"prompt": "def f(x):", "max_tokens": 5, "logprobs": 2},
        "comp-echo": {"prompt": "def f(x):", "max_tokens": 3, "echo": True, "ignore_eos": True},
    }
    bad = {
        "unknown": ({"messages": MESSAGES, "colour": "red"}, "unknown field 'colour'"),
        "n-two": ({"messages": MESSAGES, "n": "two"}, "n 'two': must be an integer"),
        "cold": ({"messages": MESSAGES, "temperature": -1}, "temperature -1: must be >= 0"),
        "many": ({"messages": MESSAGES, "n": 17}, "n 17: a row may ask for at most 16 choices"),
        "bias": ({"messages": MESSAGES, "logit_bias": {"100000": 5}}, "logit_bias: token id 100000 is outside"),
        "role": ({"messages": [{"role": "narrator", "content": "x"}]}, "messages[0].role 'narrator'"),
        "model": ({"model": "gpt-4o", "messages": MESSAGES}, "model 'gpt-4o': this job runs 'tiny'"),
        "json": ({"messages": MESSAGES, "response_format": {"type": "xml"}}, "response_format.type 'xml': must be"),
    }
    lines = [json.dumps({"custom_id": cid, "method": "POST", "url": CHAT, "body": b}) for cid, b in good.items()]
    for cid in ("comp", "comp-echo"):
        lines[list(good).index(cid)] = json.dumps({"custom_id": cid, "url": "/v1/completions", "body": good[cid]})
    lines += [json.dumps({"custom_id": cid, "url": CHAT, "body": b}) for cid, (b, _) in bad.items()]
    lines.insert(3, '{"custom_id": "broken", "url": ')  # line 4: not JSON, no custom_id to be read
    lines.append(json.dumps({"custom_id": "emb", "url": "/v1/embeddings", "body": {"input": "some text"}}))
    path = tmp_path / "batch.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    code, output = freight(["run", str(path), "--model", str(model_dir), "--output", str(out), "--max-tokens", "8"])
    assert code == 0, output
    rows = _results(out)
    assert len(rows) == len(good) + len(bad) + 2

    assert rows["chat"]["completion"] == ref and rows["chat"]["error"] is None  # text parts accepted
    assert rows["chat-stop"]["completion"] == ref[:cut] and stop not in rows["chat-stop"]["completion"]
    assert rows["chat-stop"]["finish_reason"] == "stop"
    n2 = rows["chat-n"]  # n > 1: list columns, choice 0 first, each choice the engine's own
    assert n2["completions"][0] == n2["completion"] and n2["finish_reasons"][0] == n2["finish_reason"]
    chat = engine.tokenizer.apply_chat_template(MESSAGES)
    (want,) = engine.generate([chat], SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=4))
    assert n2["completions"] == [c.text for c in want.outputs]
    assert n2["finish_reasons"] == [c.finish_reason for c in want.outputs]
    assert n2["completion_tokens"] == want.completion_tokens == sum(len(c.token_ids) for c in want.outputs)
    comp = rows["comp"]
    assert comp["endpoint"] == "/v1/completions" and comp["completions"] is None
    (choice,) = comp["logprobs"]
    assert len(choice) == comp["completion_tokens"] and "".join(t["token"] for t in choice).startswith(comp["completion"])
    for tok in choice:  # greedy: the sampled token is the likeliest; top 2, likeliest first
        assert len(tok["top_logprobs"]) == 2 and tok["top_logprobs"][0]["token_id"] == tok["token_id"]
        assert tok["logprob"] == tok["top_logprobs"][0]["logprob"] >= tok["top_logprobs"][1]["logprob"]
    assert rows["comp-echo"]["completion"] == "def f(x):" + _greedy(engine, "def f(x):", 3)
    assert rows["comp-echo"]["logprobs"] is None and rows["comp-echo"]["completion_tokens"] == 3

    for cid, (_, expected) in bad.items():
        assert rows[cid]["finish_reason"] == "error" and expected in rows[cid]["error"], (cid, rows[cid]["error"])
        assert rows[cid]["completion"] is None and rows[cid]["endpoint"] == CHAT
    assert rows["line-4"]["error"].startswith("line 4: not JSON")
    emb = rows["emb"]
    assert emb["endpoint"] == "/v1/embeddings" and emb["completion"] is None
    (want,) = engine.embed(["some text"])
    assert emb["error"] is None and emb["prompt_tokens"] == want.prompt_tokens
    assert emb["embedding"] == pytest.approx(want.embedding.tolist(), abs=1e-6)
    assert all(r["endpoint"] == CHAT for cid, r in rows.items() if cid.startswith("chat"))


def test_parquet_columns_and_job_flags_reach_the_engine(tmp_path: Path, model_dir: Path, engine: Any) -> None:
    prompts = ["def f(x):", "class A:", "import os"]
    refs = [_greedy(engine, p, 10) for p in prompts]
    # --min-tokens 2: no stop string is checked before the second token, so stops lie beyond it
    (flag_stop, flag_cut), (col_stop, col_cut) = (
        _stop_in(r, len(_greedy(engine, p, 2))) for r, p in zip(refs[:2], prompts[:2], strict=True)
    )
    table = pa.table(
        {
            "prompt": prompts,
            "stop": [None, [col_stop], None],  # row 1's column wins over the flag
            "logprobs": [None, None, False],  # row 2 turns the job's logprobs off
            "n": [None, None, 3],  # greedy choices: three equal texts
            "ignored": [1, 2, 3],
        }
    )
    data = write_parquet(table, tmp_path / "in.parquet")
    out = tmp_path / "out"
    flags = ["--stop", flag_stop, "--stop", "\u2603", "--logprobs", "1", "--min-tokens", "2", "--max-tokens", "10"]
    code, output = freight(["run", str(data), "--model", str(model_dir), "--output", str(out), *flags])
    assert code == 0, output
    spec = json.loads((out / "manifest.json").read_text())["spec"]["sampling"]
    assert spec["stop"] == [flag_stop, "\u2603"] and spec["logprobs"] == 1 and spec["min_tokens"] == 2
    rows = _results(out)
    assert rows["0"]["completion"] == refs[0][:flag_cut] and rows["1"]["completion"] == refs[1][:col_cut]
    assert [len(t["top_logprobs"]) for t in rows["0"]["logprobs"][0]] == [1] * rows["0"]["completion_tokens"]
    assert rows["2"]["logprobs"] is None and rows["2"]["endpoint"] == "/v1/completions"
    assert rows["2"]["completions"] == [rows["2"]["completion"]] * 3 and rows["0"]["completions"] is None
    assert rows["2"]["completion_tokens"] % 3 == 0 and rows["2"]["finish_reasons"] is not None

    for bad_flags, expected in [
        (["--n", "17"], "--n 17: a row may ask for at most 16 choices (FREIGHT_MAX_N)"),
        (["--logit-bias", '{"abc": 1}'], "--logit-bias '{\"abc\": 1}': logit_bias key 'abc' is not a token id"),
        (["--logit-bias", '{"5000": 1}'], "--logit-bias: token id 5000 is outside the model's vocabulary"),
        (["--min-tokens", "9", "--max-tokens", "4"], "min_tokens (9) must not exceed max_tokens (4)"),
        (["--presence-penalty", "3"], "--presence-penalty 3.0: input should be less than or equal to 2"),
    ]:
        code, output = freight(["run", str(data), "--model", str(model_dir), "--output", str(tmp_path / "x"), *bad_flags])
        assert code == 2 and expected in output, output
        assert not (tmp_path / "x").exists()


def test_resume_round_trips_the_new_columns(tmp_path: Path, model_dir: Path, engine: Any) -> None:
    lines = [
        {"custom_id": f"c{i}", "url": CHAT, "body": {"messages": [{"role": "user", "content": f"q{i}"}],
         "n": 2, "temperature": 1.0, "logprobs": True, "top_logprobs": 2, "max_tokens": 2 + i}}
        for i in range(8)
    ]  # fmt: skip
    lines.insert(2, {"custom_id": "bad", "url": CHAT, "body": {"messages": [], "n": 2}})
    lines.append({"custom_id": "emb", "url": "/v1/embeddings", "body": {"input": "x"}})
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))

    def job(name: str) -> tuple[Any, Any]:
        spec = JobSpec(input=str(path), model=str(model_dir), output=str(tmp_path / name),
                       sampling=SamplingSpec(seed=5), shard_rows=20)  # fmt: skip
        prepared = prepare_job(spec)
        return prepared.store, prepared.manifest

    ref_store, ref = job("ref")
    assert run_shard(engine, ref_store, ref, 0).status == "committed"
    store, manifest = job("out")
    finished = itertools.count(1)
    state = {"n": 0}
    first = run_shard(engine, store, manifest, 0, should_stop=lambda: state["n"] >= 5,
                      on_row=lambda _: state.update(n=next(finished)))  # fmt: skip
    assert first.status == "interrupted"
    saved = datasets.read_result(store.get(partial_key(0, 0)))
    assert 5 <= saved.num_rows < 10 and saved.column("logprobs").null_count < saved.num_rows
    second = run_shard(engine, store, manifest, 0, attempt=1)
    assert second.status == "committed" and second.record is not None
    assert second.record.rows_from_partial == saved.num_rows
    got = datasets.read_result(store.get(shard_result_key(0))).to_pylist()
    want = datasets.read_result(ref_store.get(shard_result_key(0))).to_pylist()
    # every column, list and struct columns included; logprob values within float noise (the resumed
    # rows ran in other batch shapes, whose matmuls round differently), everything else exactly
    assert [_without_logprob_values(r) for r in got] == [_without_logprob_values(r) for r in want]
    assert _logprob_values(got) == pytest.approx(_logprob_values(want), abs=1e-5)
    assert {r["id"]: r["endpoint"] for r in got}["emb"] == "/v1/embeddings"
    assert all(r["completions"] is not None and r["logprobs"] is not None for r in got if r["id"].startswith("c"))


def _without_logprob_values(row: dict[str, Any]) -> dict[str, Any]:
    """The row with each logprob value zeroed (tokens, ids and the top lists' order kept)."""
    def strip(t: dict[str, Any]) -> dict[str, Any]:
        return {**t, "logprob": 0.0, "top_logprobs": [{**x, "logprob": 0.0} for x in t["top_logprobs"]]}

    lps = row["logprobs"]
    return {**row, "logprobs": None if lps is None else [[strip(t) for t in choice] for choice in lps]}


def _logprob_values(rows: list[dict[str, Any]]) -> list[float]:
    return [
        x for r in rows for choice in r["logprobs"] or [] for t in choice
        for x in (t["logprob"], *(top["logprob"] for top in t["top_logprobs"]))
    ]  # fmt: skip
