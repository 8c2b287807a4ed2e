"""bench/gpu_check.py --dry-run: the GPU check's plumbing on the CPU (Triton interpreter, tiny sizes):
every section runs, every kernel meets its error bound against the reference, the engine's tokens
equal transformers' and each decode mode's, the JSON is complete. Its speed figures mean nothing and
are not looked at. The prepared command for a lent GPU, bench/gpu_run.sh, runs it the same way."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = {"paged_decode_attention", "prefill_attention", "int4_matmul", "int8_matmul", "store_kv_cache",
           "rms_norm+residual", "apply_rotary", "token_bitmask", "int4_gemv", "int4_dot", "int8_gemv", "int8_dot",
           "fp8_matmul", "fused_moe qwen3-30b-a3b (tiny)", "fused_moe mixtral-8x7b (tiny)",
           "fused_moe gpt-oss-20b (tiny)", "lora qkv"}


def _dry_run(tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), str(out), "--dry-run", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def _prepared_dry_run(tmp_path: Path, *flags: str) -> dict:
    """bench/gpu_run.sh --dry-run FLAGS: the one prepared command a lent GPU runs, on this CPU."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    proc = subprocess.run([str(ROOT / "bench" / "gpu_run.sh"), "--dry-run", *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "torch" in (tmp_path / "gpu_check.log").read_text()
    return json.loads((tmp_path / "gpu_check.json").read_text())


def test_prepared_gpu_command_dry_run_kernels(tmp_path: Path) -> None:
    """Every kernel against its reference and roofline, through the prepared command."""
    report = _prepared_dry_run(tmp_path, "--skip-engine", "--skip-sweep", "--skip-exactness")
    assert report["mode"] == "interpret" and report["errors"] == []
    assert set(report["ceilings"]) == {"copy_gbps", "matmul_tflops"}
    assert {k["name"] for k in report["kernels"]} == KERNELS
    assert all(k["ok"] and k["rel_err"] <= k["bound"] and k["median_ms"] > 0 for k in report["kernels"])
    assert {t["name"].split(" ")[0] for t in report["targets"]} == {"paged", "prefill", "int4", "int8", "fp8",
                                                                    "fused_moe", "lora"}
    moe = [k for k in report["kernels"] if k["name"].startswith("fused_moe")]
    assert len(moe) == 3 and all(k["loop_ms"] > 0 and k["experts_used"] > 1 for k in moe)
    assert [k["options"] for k in moe if "gpt-oss" in k["name"]] == ["biases, clamped SwiGLU limit 7.0 alpha 1.702"]
    # decode M: the wrappers' choice and both kernels forced, each against bf16 and the roofline
    decode = [k for k in report["kernels"] if k["name"].startswith(("int4", "int8", "fp8")) and k["unit"] == "GB/s"]
    assert {(k["name"], k["shape"].split()[0]) for k in decode} >= {
        (f"int{b}_{kind}", f"M={m}") for b in (4, 8) for kind in ("matmul", "gemv", "dot") for m in (1, 2, 3, 16)
    }
    assert all(k["speedup_vs_bf16"] > 0 and k["of_roofline"] > 0 and k["timing"] == "cuda graph" for k in decode)
    fp8 = [t for t in report["targets"] if t["name"].startswith("fp8")]
    assert [t["goal"] for t in fp8] == [1.6] and "M=70" in fp8[0]["name"]


@pytest.mark.slow
def test_prepared_gpu_command_dry_run_exactness(tmp_path: Path) -> None:
    """The exactness section through the prepared command (interpreted, about a minute)."""
    report = _prepared_dry_run(tmp_path, "--skip-kernels", "--skip-sweep", "--skip-engine")
    exact = report["exactness"]
    assert report["errors"] == [] and set(exact["archs"]) == {"llama", "qwen3_moe"}
    assert set(exact["modes"]) == {"graphs vs eager", "overlapped vs serial"}
    assert all(row["exact"] and row["identical"] == row["rows"] == 4 for row in [*exact["archs"].values(),
                                                                                 *exact["modes"].values()])


@pytest.mark.slow
def test_dry_run_everything(tmp_path: Path) -> None:
    report = _dry_run(tmp_path)
    assert report["errors"] == []
    assert all("error" not in row for row in report["sweep"])
    assert {row["kernel"] for row in report["sweep"]} >= {"int4_gemv", "int8_gemv", "int4_matmul"}
    engine = report["engine"]
    assert engine["runs"]["triton"]["errors"] == 0
    assert engine["same_greedy_outputs"] == engine["runs"]["triton"]["requests"]
    assert engine["structured_over_unconstrained"] > 0 and engine["runs"]["triton+json_schema"]["errors"] == 0
