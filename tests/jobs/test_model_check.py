"""A model the engine cannot load is refused before OUT/manifest.json exists (run and submit), with a
message naming what is missing; the check reads headers only and imports no torch."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pipeline_data import prompts_table, write_parquet
from typer.testing import CliRunner

from freight_cli import app
from jobs.errors import ModelNotFoundError
from jobs.model_check import check_model
from jobs.settings import Settings


def _edit_config(model: Path, change: Callable[[dict], None]) -> None:
    config = json.loads((model / "config.json").read_text())
    change(config)
    (model / "config.json").write_text(json.dumps(config))


def _truncate(model: Path) -> None:
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) // 2])


def _garbage_header(model: Path) -> None:
    (model / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"hello" + b"\0" * 64)


def _shard_missing(model: Path) -> None:
    header_len = struct.unpack("<Q", (model / "model.safetensors").read_bytes()[:8])[0]
    header = json.loads((model / "model.safetensors").read_bytes()[8 : 8 + header_len])
    names = [n for n in header if n != "__metadata__"]
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    weight_map = {n: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, n in enumerate(names)}
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _wrong_layers(model: Path) -> None:
    _edit_config(model, lambda c: c.update(num_hidden_layers=c["num_hidden_layers"] + 1))


def _wrong_vocab(model: Path) -> None:
    _edit_config(model, lambda c: c.update(vocab_size=c["vocab_size"] + 7))


def _unknown_dtype(model: Path) -> None:
    """One tensor's dtype renamed to one safetensors does not know (the header keeps its length)."""
    data = (model / "model.safetensors").read_bytes()
    header_len = struct.unpack("<Q", data[:8])[0]
    header = data[8 : 8 + header_len].decode()
    patched = header.replace('"dtype":"F16"', '"dtype":"Q7X"', 1).replace('"dtype":"F32"', '"dtype":"Q7X"', 1)
    assert patched != header and len(patched) == len(header)
    (model / "model.safetensors").write_bytes(data[:8] + patched.encode() + data[8 + header_len :])


BROKEN: dict[str, tuple[Callable[[Path], None], str]] = {
    "unknown dtype": (_unknown_dtype, "has dtype 'Q7X', which freight cannot load"),
    "config implies terabytes (intermediate_size)": (
        lambda m: _edit_config(m, lambda c: c.update(intermediate_size=10**9)),
        "parameters, the weights hold",
    ),
    "unknown architecture": (
        lambda m: _edit_config(m, lambda c: c.update(architectures=["GPT2LMHeadModel"])),
        "config.json names architecture ['GPT2LMHeadModel'], which freight does not support",
    ),
    "no architectures": (
        lambda m: _edit_config(m, lambda c: (c.pop("architectures"), c.pop("model_type", None))),
        "config.json has no architectures",
    ),
    "missing hidden_size": (lambda m: _edit_config(m, lambda c: c.pop("hidden_size")), "config.json has no hidden_size"),
    "missing num_hidden_layers": (
        lambda m: _edit_config(m, lambda c: c.pop("num_hidden_layers")),
        "config.json has no num_hidden_layers",
    ),
    "bad head count": (
        lambda m: _edit_config(m, lambda c: c.update(num_attention_heads="four")),
        "num_attention_heads must be a positive integer, not 'four'",
    ),
    "missing tokenizer": (lambda m: (m / "tokenizer.json").unlink(), "has no tokenizer.json"),
    "broken tokenizer": (lambda m: (m / "tokenizer.json").write_text("{oops"), "tokenizer.json is not valid JSON"),
    "truncated weights": (_truncate, "model.safetensors is truncated"),
    "not safetensors": (_garbage_header, "header that is not JSON"),
    "shard missing": (_shard_missing, "model-00002-of-00002.safetensors, which is missing"),
    "weights of another model (layers)": (_wrong_layers, "decoder layers, config.json says num_hidden_layers"),
    "weights of another model (vocab)": (_wrong_vocab, "model.embed_tokens.weight is"),
}


@pytest.fixture
def broken_model(tmp_path: Path, demo_model_dir: Path) -> Callable[[str], Path]:
    def make(case: str) -> Path:
        model = tmp_path / "model"
        shutil.copytree(demo_model_dir, model)
        BROKEN[case][0](model)
        return model

    return make


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_check_model_names_what_is_wrong(case: str, broken_model: Callable[[str], Path]) -> None:
    model = broken_model(case)
    with pytest.raises(ModelNotFoundError) as err:
        check_model(str(model))
    assert BROKEN[case][1] in str(err.value)
    assert "\n" not in str(err.value)


def test_the_engine_refuses_configs_with_the_same_words(tmp_path: Path, demo_model_dir: Path) -> None:
    from worker.engine.models import ModelConfig

    config = json.loads((demo_model_dir / "config.json").read_text())
    ModelConfig.from_dict(config)
    for key in ("hidden_size", "vocab_size", "intermediate_size"):
        with pytest.raises(ValueError, match=f"^config.json has no {key}$"):
            ModelConfig.from_dict({k: v for k, v in config.items() if k != key})
    with pytest.raises(ValueError, match="does not support"):
        ModelConfig.from_dict({**config, "architectures": ["GPT2LMHeadModel"]})


@pytest.mark.parametrize("command", ["run", "submit"])
@pytest.mark.parametrize("case", ["unknown architecture", "missing hidden_size", "missing tokenizer", "truncated weights",
                                  "unknown dtype", "config implies terabytes (intermediate_size)"])
def test_run_and_submit_refuse_a_broken_model_before_the_manifest(
    command: str, case: str, tmp_path: Path, demo_model_dir: Path, broken_model: Callable[[str], Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("FREIGHT_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing may reach a queue
    model = broken_model(case)
    data = write_parquet(prompts_table(4, bad=False), tmp_path / "in.parquet")
    out = tmp_path / "out"
    args = [command, str(data), "--model", str(model), "--output", str(out), "--max-tokens", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and BROKEN[case][1] in lines[0], result.output
    assert not out.exists()
    if command == "run":  # the user fixes the model in place and reruns the same command: it runs
        shutil.rmtree(model)
        shutil.copytree(demo_model_dir, model)
        again = CliRunner().invoke(app, args)
        assert again.exit_code == 0, again.output
        assert (out / "_SUCCESS").exists()


def test_the_check_reads_s3_headers(s3_env: Settings, demo_model_dir: Path, tmp_path: Path) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_env.s3_endpoint_url)
    prefix = f"{tmp_path.name}/model"
    for f in demo_model_dir.iterdir():
        client.put_object(Bucket="freight-test", Key=f"{prefix}/{f.name}", Body=f.read_bytes())
    check_model(f"s3://freight-test/{prefix}", s3_env)
    data = (demo_model_dir / "model.safetensors").read_bytes()
    client.put_object(Bucket="freight-test", Key=f"{prefix}/model.safetensors", Body=data[:-100])
    with pytest.raises(ModelNotFoundError, match="model.safetensors is truncated"):
        check_model(f"s3://freight-test/{prefix}", s3_env)


def test_the_check_imports_no_torch(demo_model_dir: Path) -> None:
    code = (
        "import sys; from jobs.model_check import check_model; "
        f"check_model({str(demo_model_dir)!r}); "
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'safetensors'))); "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
