"""LoRA adapters in jobs, end to end on the tiny demo model with peft-made adapters: a Parquet job whose
rows pick adapters by their `adapter` column (rows of different adapters in every shard, an unknown
name as that row's error) gives each row the tokens the engine gives it alone, says which adapter
answered, and splits cost.json's tokens, engine seconds and dollars by adapter; an OpenAI-Batch file
names adapters by `model` and gets them back in its output bodies; adapters under an S3 prefix load
through the model cache; bad adapters and flags are refused before anything is written."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from freight_runner import freight, freight_ok
from openai_check import parse_output
from pipeline_data import write_parquet

from jobs import datasets

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from tiny_adapters import make_adapter  # noqa: E402

pytest.importorskip("peft")
ASSIGN = ["alpha", "beta", None, "alpha", "gamma-not-there", None, "beta", "alpha"]
# rows 0, 2 and 6 share a prompt under alpha, the model and beta: no duplicate rows across adapters
PROMPTS = ["def add(a, b):", "class Queue:", "def add(a, b):", "import os\n", "x = 1", "for i in range(3):",
           "def add(a, b):", "while True:"]  # fmt: skip


@pytest.fixture(scope="module")
def adapters(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(demo_model_dir).float().eval()
    root = tmp_path_factory.mktemp("adapters")
    return {"alpha": make_adapter(base, root / "alpha", rank=8, seed=1, scale=0.3),
            "beta": make_adapter(base, root / "beta", rank=16, seed=2, scale=0.3, targets=("q_proj", "v_proj"))}  # fmt: skip


def _engine_tokens(model: Path, adapters: dict[str, Path], prompts: list[str], names: list[str | None]) -> list[str]:
    """What the engine gives each prompt under its adapter, each adapter's rows run alone."""
    from worker.engine import Engine, EngineConfig, SamplingParams

    engine = Engine.from_pretrained(model, EngineConfig(kv_cache_bytes=16 << 20))
    engine.set_loras(adapters)
    texts: list[str] = [""] * len(prompts)
    for name in set(names):
        mine = [i for i, n in enumerate(names) if n == name]
        outs = engine.generate([prompts[i] for i in mine], SamplingParams(max_tokens=8), adapters=[name] * len(mine))
        for i, out in zip(mine, outs, strict=True):
            texts[i] = out.text
    return texts


def _lora_flags(adapters: dict[str, Any]) -> list[str]:
    return [arg for name, path in adapters.items() for arg in ("--lora", f"{name}={path}")]


def test_mixed_adapter_job_rows_and_cost(demo_model_dir: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    data = write_parquet(pa.table({"id": [f"r{i}" for i in range(len(PROMPTS))], "prompt": PROMPTS,
                                   "adapter": ASSIGN}), tmp_path / "in.parquet")  # fmt: skip
    out = tmp_path / "out"
    freight_ok(["run", str(data), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "8",
                "--shard-rows", "4", "--max-loras", "2", "--id-column", "id", *_lora_flags(adapters)])  # fmt: skip
    table = ds.dataset(out / "shards").to_table()
    assert table.schema == datasets.result_schema(likelihood=False)
    rows = {r["id"]: r for r in table.to_pylist()}
    ran = [i for i, a in enumerate(ASSIGN) if a != "gamma-not-there"]
    want = _engine_tokens(demo_model_dir, adapters, [PROMPTS[i] for i in ran], [ASSIGN[i] for i in ran])
    for i, text in zip(ran, want, strict=True):
        row = rows[f"r{i}"]
        assert row["error"] is None and row["completion"] == text and row["adapter"] == ASSIGN[i], row
    bad = rows["r4"]
    assert bad["finish_reason"] == "error" and "adapter 'gamma-not-there'" in bad["error"] and "alpha, beta" in bad["error"]
    same = [rows[f"r{i}"]["completion"] for i in (0, 2, 6)]  # one prompt under alpha, the model, beta
    assert len(set(same)) == 3

    cost = json.loads((out / "cost.json").read_text())
    assert set(cost["adapters"]) == {"alpha", "beta"}
    for name, usage in [*cost["adapters"].items(), (None, cost["base"])]:
        mine = [r for r in rows.values() if r["adapter"] == name and (name is not None or r["id"] != "r4")]
        assert usage["rows"] == len(mine) + (1 if name is None else 0)  # the unknown adapter's row: the model's
        assert usage["completion_tokens"] == sum(r["completion_tokens"] for r in mine)
        assert usage["prompt_tokens"] == sum(r["prompt_tokens"] for r in mine)
        assert usage["busy_seconds"] > 0 and usage["cost_usd"] >= 0
    assert cost["base"]["rows_failed"] == 1
    split = sum(u["busy_seconds"] for u in cost["adapters"].values()) + cost["base"]["busy_seconds"]
    assert split == pytest.approx(cost["prefill_seconds"] + cost["decode_seconds"], rel=1e-6)
    dollars = sum(u["cost_usd"] for u in cost["adapters"].values()) + cost["base"]["cost_usd"]
    assert dollars == pytest.approx(cost["cost_usd"], rel=1e-6)


def test_batch_file_names_adapters_by_model(demo_model_dir: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    lines = []
    for i, (prompt, name) in enumerate(zip(PROMPTS, ASSIGN, strict=True)):
        body: dict[str, Any] = {"prompt": prompt, "max_tokens": 8}
        if name is not None:
            body["model"] = name
        lines.append({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": body})
    data = tmp_path / "batch.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    freight_ok(["run", str(data), "--model", str(demo_model_dir), "--output", str(out), *_lora_flags(adapters)])
    export, errors = tmp_path / "output.jsonl", tmp_path / "errors.jsonl"
    freight_ok(["results", str(out), "--format", "openai", "--to", str(export), "--errors", str(errors)])
    parsed = {raw["custom_id"]: (raw, body) for raw, body in parse_output(export)}
    ran = [i for i, a in enumerate(ASSIGN) if a != "gamma-not-there"]
    want = _engine_tokens(demo_model_dir, adapters, [PROMPTS[i] for i in ran], [ASSIGN[i] for i in ran])
    for i, text in zip(ran, want, strict=True):
        raw, body = parsed[f"c{i}"]
        assert body.choices[0].text == text
        assert body.model == (ASSIGN[i] or str(demo_model_dir))
    [failed] = [json.loads(t) for t in errors.read_text().splitlines()]
    assert failed["custom_id"] == "c4" and "gamma-not-there" in failed["error"]["message"]


def test_adapters_under_an_s3_prefix(demo_model_dir: Path, adapters: dict[str, Path], tmp_path: Path, s3_env) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env.s3_endpoint_url)
    for f in adapters["beta"].iterdir():
        client.upload_file(str(f), "freight-test", f"adapters/beta/{f.name}")
    data = write_parquet(pa.table({"prompt": PROMPTS[:3], "adapter": ["beta", None, "beta"]}), tmp_path / "in.parquet")
    out = tmp_path / "out"
    freight_ok(["run", str(data), "--model", str(demo_model_dir), "--output", str(out), "--max-tokens", "8",
                "--lora", "beta=s3://freight-test/adapters/beta/"])  # fmt: skip
    got = [r["completion"] for r in ds.dataset(out / "shards").to_table().to_pylist()]
    assert got == _engine_tokens(demo_model_dir, {"beta": adapters["beta"]}, PROMPTS[:3], ["beta", None, "beta"])


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--lora", "alpha"], "give NAME=PATH"),
        (["--lora", "al pha=/x"], "--lora 'al pha=/x'"),
        (["--lora", "a=ALPHA", "--lora", "a=BETA"], "names a more than once"),
        (["--lora", "a=/no/such/adapter"], "adapter a (/no/such/adapter) has no adapter_config.json"),
        (["--max-loras", "2"], "--max-loras sets how many"),
        (["--lora", "a=WIDE"], "adapter a: model.layers.0.self_attn.q_proj has A"),
    ],
)
def test_bad_adapters_are_refused_before_anything_is_written(demo_model_dir: Path, adapters: dict[str, Path],
                                                             tmp_path: Path, flags: list[str], words: str) -> None:  # fmt: skip
    wide = tmp_path / "wide"  # an adapter whose config names this model but whose factors are another's
    shutil.copytree(adapters["alpha"], wide)
    config = json.loads((demo_model_dir / "config.json").read_text())
    config["hidden_size"] = 2 * config["hidden_size"]
    from safetensors.torch import load_file, save_file

    tensors = load_file(wide / "adapter_model.safetensors")
    save_file({k: v.repeat(1, 2) if ".lora_A." in k else v for k, v in tensors.items()}, wide / "adapter_model.safetensors")
    flags = [f.replace("ALPHA", str(adapters["alpha"])).replace("BETA", str(adapters["beta"]))
             .replace("WIDE", str(wide)) for f in flags]  # fmt: skip
    data = write_parquet(pa.table({"prompt": PROMPTS}), tmp_path / "in.parquet")
    out = tmp_path / "out"
    code, output = freight(["run", str(data), "--model", str(demo_model_dir), "--output", str(out), *flags])
    assert code == 2 and words in output, output
    assert not out.exists()


def test_estimate_keeps_adapters_apart_and_splits_by_adapter(demo_model_dir: Path, adapters: dict[str, Path],
                                                             tmp_path: Path) -> None:  # fmt: skip
    """One prompt under alpha, beta and the model is computed three times (the prefix cache never
    shares blocks across adapters); a longer prompt under alpha reuses alpha's blocks."""
    shared = "def add(a, b):\n    return a + b\n" * 6
    table = pa.table({"id": ["a", "b", "m", "a2"], "prompt": [shared, shared, shared, shared + "x = add(1, 2)\n"],
                      "adapter": ["alpha", "beta", None, "alpha"]})  # fmt: skip
    data = write_parquet(table, tmp_path / "in.parquet")
    raw = freight_ok(["estimate", str(data), "--model", str(demo_model_dir), "--max-tokens", "8", "--id-column", "id",
                      "--json", *_lora_flags(adapters)])  # fmt: skip
    est = json.loads(raw.strip().splitlines()[-1])
    split = {**est["adapters"], "": est["base"]}
    assert {k: v["rows"] for k, v in split.items()} == {"alpha": 2, "beta": 1, "": 1}
    one = split["beta"]["computed_prompt_tokens"]
    assert split[""]["computed_prompt_tokens"] == one and one >= 32
    reused = est["prompt_tokens"] - est["computed_prompt_tokens"]
    assert reused > 0 and reused % 16 == 0 and split["alpha"]["computed_prompt_tokens"] < 2 * one + 16
    assert sum(v["computed_prompt_tokens"] for v in split.values()) == est["computed_prompt_tokens"]
    assert sum(v["cost_usd"] for v in split.values()) == pytest.approx(est["cost_usd"], rel=1e-6)
    plain = freight_ok(["estimate", str(data), "--model", str(demo_model_dir), "--max-tokens", "8", "--id-column", "id"])
    assert "the model itself" not in plain and "adapter alpha" not in plain
    text = freight_ok(["estimate", str(data), "--model", str(demo_model_dir), "--max-tokens", "8", "--id-column", "id",
                       *_lora_flags(adapters)])  # fmt: skip
    assert "adapter alpha" in text and "the model itself" in text
