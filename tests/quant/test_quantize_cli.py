"""`freight quantize`: a working GPTQ run from a Parquet file, and bad inputs that fail clearly, writing nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from freight_cli import app
from jobs.log import configure_logging
from worker.demo_model import make_demo_model
from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.quant import Int4Linear

runner = CliRunner()


def _quantize(*args: str):
    result = runner.invoke(app, ["quantize", *args])
    configure_logging()  # the CLI bound structlog to the runner's stderr, closed by now
    return result


def test_int4_gptq_from_a_parquet_column_loads_and_generates(reference_model: Path, real_texts: list[str],
                                                             tmp_path: Path) -> None:
    data = tmp_path / "sample.parquet"
    pq.write_table(pa.table({"id": list(range(4)), "text": real_texts[:4]}), data)
    out = tmp_path / "gptq"
    result = _quantize(str(reference_model), "--method", "int4-gptq", "--group-size", "64",
                       "--calibration", str(data), "--calibration-column", "text", "--output", str(out), "--lm-head")
    assert result.exit_code == 0, result.output
    assert "int4-gptq group 64" in result.output and "and lm_head" in result.output
    engine = Engine.from_pretrained(out, EngineConfig(device="cpu", kv_cache_bytes=8 << 20))
    assert sum(isinstance(m, Int4Linear) for m in engine.runner.model.modules()) == 16 + 1  # the head too
    assert isinstance(engine.runner.model.lm_head, Int4Linear) and engine.runner.model.decode_stack is not None
    [res] = engine.generate(["def add(a, b):\n"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(res.token_ids) == 4


def test_fp8_checkpoint_from_the_command_line(reference_model: Path, tmp_path: Path) -> None:
    from worker.engine.quant import Fp8Linear

    out = tmp_path / "fp8"
    result = _quantize(str(reference_model), "--method", "fp8", "--output", str(out))
    assert result.exit_code == 0, result.output
    assert "fp8, decoder Linear weights" in " ".join(result.output.split())
    engine = Engine.from_pretrained(out, EngineConfig(device="cpu", kv_cache_bytes=8 << 20))
    assert sum(isinstance(m, Fp8Linear) for m in engine.runner.model.modules()) == 16
    [res] = engine.generate(["def add(a, b):\n"], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(res.token_ids) == 4


@pytest.fixture(scope="module")
def narrow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random model whose hidden size (64) no int4 group of 128 divides."""
    out = tmp_path_factory.mktemp("narrow") / "model"
    make_demo_model(out, size="tiny")
    return out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "int3"], "--method': 'int3' is not one of 'int8', 'int4-rtn', 'int4-gptq'"),
        (["--method", "int4-rtn", "--group-size", "128"], "group size 128 does not divide"),
        (["--method", "int4-rtn", "--group-size", "48"], "group size 48 is not supported"),
        (["--method", "int4-gptq"], "needs calibration data"),
        (["--method", "int4-gptq", "--calibration", "{data}", "--calibration-column", "prompt"],
         "has no column 'prompt'"),
        (["--method", "int4-gptq", "--calibration", "{missing}"], "does not exist"),
        (["--method", "int8", "--calibration", "{data}"], "only by int4-gptq"),
    ],
)
def test_bad_inputs_fail_with_a_clear_message_and_write_nothing(narrow_model: Path, tmp_path: Path,
                                                                args: list[str], message: str) -> None:
    data = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": ["def f():\n    return 1\n"]}), data)
    args = [a.format(data=data, missing=tmp_path / "nope.parquet") for a in args]
    out = tmp_path / "out"
    result = _quantize(str(narrow_model), *args, "--output", str(out))
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["rows.parquet"]  # no half-written folder beside it


def test_lm_head_of_a_tied_model_or_fp8_is_refused(tmp_path: Path) -> None:
    tied = make_demo_model(tmp_path / "tied", "qwen2", tie_word_embeddings=True)
    result = _quantize(str(tied), "--method", "int8", "--lm-head", "--output", str(tmp_path / "q"))
    assert result.exit_code == 2 and "ties lm_head to its embeddings" in " ".join(result.output.split())
    result = _quantize(str(tied), "--method", "fp8", "--lm-head", "--output", str(tmp_path / "q"))
    assert result.exit_code == 2 and "fp8 keeps it in full precision" in " ".join(result.output.split())
    assert not (tmp_path / "q").exists()


def test_existing_output_and_quantized_input_are_refused(reference_model: Path, tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    result = _quantize(str(reference_model), "--method", "int8", "--output", str(taken))
    assert result.exit_code == 2 and "already exists" in result.output
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    first = tmp_path / "q8"
    assert _quantize(str(reference_model), "--method", "int8", "--output", str(first)).exit_code == 0
    again = _quantize(str(first), "--method", "int4-rtn", "--output", str(tmp_path / "q4"))
    assert again.exit_code == 2 and "already quantized" in again.output
