"""`freight run --task embed`: the embedding column against transformers, the cost of input tokens
only, refusals at submit, resume from partial embedding rows, row errors without a pooling config."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import torch
from freight_runner import freight
from pipeline_data import write_parquet

from jobs import datasets
from jobs.manifest import partial_key, shard_result_key
from jobs.planner import prepare_job
from jobs.spec import JobSpec
from worker.demo_model import add_pooling_config, make_demo_model
from worker.shard import run_shard

transformers = pytest.importorskip("transformers")

TEXTS = [
    "def add(a, b):",
    None,
    "import json\n\nclass Encoder(json.JSONEncoder):",
    "",
    "for i in range(10):\n    print(i)",
    "x = [1, 2, 3]",
    "word " * 40,
    "# a comment",
    "return None",
    "while True:\n    break",
]
BAD = {1: "null prompt", 3: "empty prompt"}


@pytest.fixture(scope="module")
def embed_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen3-Embedding-like demo checkpoint: last-token pooling, Normalize, an EOS appended per text."""
    path = make_demo_model(tmp_path_factory.mktemp("models") / "qwen3-embed", arch="qwen3")
    return add_pooling_config(path, "lasttoken", normalize=True, append_eos=True)


@torch.no_grad()
def oracle(model_dir: Path, texts: list[str], dims: int | None) -> list[tuple[int, np.ndarray]]:
    """(prompt tokens, embedding) per text: transformers' tokenizer and final hidden state, last token,
    truncated, normalized."""
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir).float().eval()
    out = []
    for text in texts:
        ids = tok(text)["input_ids"]
        vec = model(torch.tensor([ids])).last_hidden_state[0, -1, :dims]
        out.append((len(ids), torch.nn.functional.normalize(vec, dim=0).numpy()))
    return out


def test_embed_job_end_to_end(tmp_path: Path, embed_model: Path) -> None:
    data = write_parquet(pa.table({"id": [f"t{i}" for i in range(len(TEXTS))], "text": TEXTS}), tmp_path / "in.parquet")
    out = tmp_path / "out"
    args = ["run", str(data), "--model", str(embed_model), "--output", str(out), "--id-column", "id",
            "--prompt-column", "text", "--task", "embed", "--dimensions", "24", "--shard-rows", "4"]  # fmt: skip
    code, output = freight(args)
    assert code == 0, output
    table = ds.dataset(out / "shards").to_table()
    assert table.schema.field("embedding").type == pa.list_(pa.float32())
    rows = {r["id"]: r for r in table.to_pylist()}
    want = oracle(embed_model, [t for t in TEXTS if t], 24)
    good = [i for i in range(len(TEXTS)) if i not in BAD]
    for i, (tokens, vec) in zip(good, want, strict=True):
        r = rows[f"t{i}"]
        assert (r["finish_reason"], r["completion"], r["completion_tokens"], r["error"]) == ("stop", None, 0, None)
        assert r["prompt_tokens"] == tokens and r["cached_tokens"] == 0
        np.testing.assert_allclose(np.asarray(r["embedding"], np.float32), vec, atol=1e-5, rtol=0)
    for i, why in BAD.items():
        r = rows[f"t{i}"]
        assert r["finish_reason"] == "error" and why in r["error"] and r["embedding"] is None

    report = json.loads((out / "cost.json").read_text())
    assert report["rows"] == len(TEXTS) and report["rows_failed"] == len(BAD)
    assert report["prompt_tokens"] == sum(t for t, _ in want) and report["completion_tokens"] == 0
    assert report["decode_seconds"] == 0 and report["busy_seconds"] > 0
    assert report["prefill_seconds"] == pytest.approx(report["busy_seconds"])
    assert report["output_cost_usd"] == 0 and report["usd_per_million_output_tokens"] is None
    assert report["cost_usd"] > 0 and report["input_cost_usd"] == pytest.approx(report["cost_usd"])
    assert report["usd_per_million_input_tokens"] == pytest.approx(report["cost_usd"] / report["prompt_tokens"] * 1e6)
    assert sum(s["prompt_tokens"] for s in report["shards"]) == report["prompt_tokens"]

    code, output = freight(args)  # the same spec resumes: nothing left to do
    assert code == 0 and "already complete" in output
    code, output = freight(args[:-4] + ["--dimensions", "8", "--shard-rows", "4"])  # another spec, same OUT
    assert code != 0 and "--dimensions was 24, now 8" in output


def test_embed_jobs_are_refused_at_submit(tmp_path: Path, embed_model: Path, demo_model_dir: Path) -> None:
    text = write_parquet(pa.table({"prompt": ["a", "b"], "cont": ["c", "d"]}), tmp_path / "text.parquet")
    messages = write_parquet(pa.table({"messages": [[{"role": "user", "content": "hi"}]]}), tmp_path / "m.parquet")
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                                 "body": {"model": "m", "input": "hi"}}) + "\n")  # fmt: skip
    cases = [
        ([str(text), "--model", str(demo_model_dir), "--task", "embed"], "has no pooling config"),
        ([str(messages), "--model", str(embed_model), "--task", "embed", "--prompt-column", "messages"],
         "holds chat messages"),
        ([str(jsonl), "--model", str(embed_model), "--task", "embed"], "drop --task embed"),
        ([str(text), "--model", str(embed_model), "--dimensions", "8"], "needs --task embed"),
        ([str(text), "--model", str(embed_model), "--task", "embed", "--continuation-column", "cont"],
         "likelihood scoring"),
        ([str(text), "--model", str(embed_model), "--task", "embed", "--dimensions", "0"], "--dimensions 0"),
    ]  # fmt: skip
    for k, (args, message) in enumerate(cases):
        out = tmp_path / f"out{k}"
        code, output = freight(["run", *args, "--output", str(out)])
        assert code != 0 and message in " ".join(output.split()), output
        assert not out.exists()  # refused before anything is written


def _job(tmp_path: Path, model: Path, name: str, **kw: Any) -> tuple[Any, Any]:
    data = tmp_path / "in.parquet"
    if not data.exists():
        write_parquet(pa.table({"id": [f"t{i}" for i in range(len(TEXTS))], "prompt": TEXTS}), data)
    spec = JobSpec(input=str(data), model=str(model), output=str(tmp_path / name), id_column="id", task="embed",
                   shard_rows=len(TEXTS), **kw)  # fmt: skip
    prepared = prepare_job(spec)
    return prepared.store, prepared.manifest


def test_an_interrupted_embed_shard_resumes_from_partial_embedding_rows(tmp_path: Path, embed_model: Path) -> None:
    from worker.engine import Engine, EngineConfig

    # a small step budget: the shard's rows take several forwards, so it can stop between them
    engine = Engine.from_pretrained(embed_model, EngineConfig(kv_cache_bytes=16 << 20, max_num_batched_tokens=16,
                                                              max_num_seqs=2))  # fmt: skip
    ref_store, ref = _job(tmp_path, embed_model, "ref", dimensions=12)
    assert run_shard(engine, ref_store, ref, 0).status == "committed"

    store, manifest = _job(tmp_path, embed_model, "out", dimensions=12)
    finished = itertools.count(1)
    state = {"n": 0}

    def on_row(_: Any) -> None:
        state["n"] = next(finished)

    first = run_shard(engine, store, manifest, 0, attempt=0, should_stop=lambda: state["n"] >= 5, on_row=on_row)
    assert first.status == "interrupted"
    saved = datasets.read_result(store.get(partial_key(0, 0)))
    assert 5 <= saved.num_rows < len(TEXTS)
    assert saved.schema.field("embedding").type == pa.list_(pa.float32())
    assert sum(v is not None for v in saved.column("embedding").to_pylist()) >= 3

    counted: list = []
    second = run_shard(engine, store, manifest, 0, attempt=1, on_row=counted.append)
    assert second.status == "committed" and second.record.rows_from_partial == saved.num_rows
    assert len(counted) == len(TEXTS) - saved.num_rows  # only the rest was computed
    assert second.record.completion_tokens == 0 and second.record.decode_seconds == 0
    got = datasets.read_result(store.get(shard_result_key(0))).to_pylist()
    want = datasets.read_result(ref_store.get(shard_result_key(0))).to_pylist()
    for g, w in zip(got, want, strict=True):
        assert {k: g[k] for k in ("id", "finish_reason", "prompt_tokens", "error")} == {
            k: w[k] for k in ("id", "finish_reason", "prompt_tokens", "error")}  # fmt: skip
        if w["embedding"] is not None:
            assert len(g["embedding"]) == 12
            np.testing.assert_allclose(g["embedding"], w["embedding"], atol=1e-6)
    engine.block_manager.check_invariants([])


def test_a_model_without_pooling_config_fails_each_embeddings_row(
    tmp_path: Path, embed_model: Path, demo_model_dir: Path
) -> None:
    """The worker's model has no pooling config (it changed after submit): each row says why."""
    from worker.engine import Engine, EngineConfig

    store, manifest = _job(tmp_path, embed_model, "out")
    plain = shutil.copytree(demo_model_dir, tmp_path / "plain")
    outcome = run_shard(Engine.from_pretrained(plain, EngineConfig(kv_cache_bytes=4 << 20)), store, manifest, 0)
    assert outcome.status == "committed" and outcome.rows_failed == len(TEXTS)
    rows = datasets.read_result(store.get(shard_result_key(0))).to_pylist()
    for i, r in enumerate(rows):
        assert r["embedding"] is None and r["finish_reason"] == "error"
        assert BAD[i] in r["error"] if i in BAD else "has no pooling config" in r["error"]
