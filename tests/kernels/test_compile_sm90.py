"""The compiled path, which the interpreter never exercises: every kernel at its wrapper's default
launch config compiles for Hopper (sm_90) with ptxas, fits in shared memory, does not spill, and
its dots become tensor-core instructions. No GPU needed (bench/compile_check.py)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_default_configs_compile_for_sm90() -> None:
    from kernels.triton.quant_gemv import INT4_GEMV_MAX_M, INT8_GEMV_MAX_M

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "compile_check.py"), "--defaults"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split("  ")[0].strip(): line.split() for line in proc.stdout.splitlines()[1:] if line.strip()}
    assert len(rows) == 19, proc.stdout
    for label, cols in rows.items():
        if label.startswith(("decode BN", "prefill", "int4", "int8", "lora")):
            assert "mma" in cols or "wgmma" in cols, f"{label}: no tensor-core dot\n{proc.stdout}"
    # The loop's instructions per weight: the GEMV pays ~1.5 more per row of x (CUDA-core
    # multiply-adds), the tensor-core kernel the same at any M; at M=1 the int4 GEMV is the cheaper
    per_weight = {label: float(cols[-2]) for label, cols in rows.items() if cols[-2] != "-"}
    for bits, limit in ((4, INT4_GEMV_MAX_M), (8, INT8_GEMV_MAX_M)):
        gemv = [per_weight[f"gemv int{bits} M<={m} BN=128 w=1"] for m in (1, 2, 4) if m <= limit]
        assert len(gemv) == {4: 3, 8: 2}[bits] and all(0 < a < b for a, b in zip(gemv, gemv[1:], strict=False)), gemv
        assert per_weight[f"int{bits} BM=16 BN=64 BK=128 w=4 s=4"] > 0
    assert per_weight["gemv int4 M<=1 BN=128 w=1"] < per_weight["int4 BM=16 BN=64 BK=128 w=4 s=4"]
