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
    assert len(rows) == 17, proc.stdout
    for label, cols in rows.items():
        if label.startswith(("decode BN", "prefill", "int4", "int8")):
            assert "mma" in cols or "wgmma" in cols, f"{label}: no tensor-core dot\n{proc.stdout}"
    # The wrappers send M <= INT{4,8}_GEMV_MAX_M to the GEMV kernels because their loop costs no
    # more instructions per weight than the tensor-core kernel's there (within 5%: M=4 int4 ties).
    per_weight = {label: float(cols[-2]) for label, cols in rows.items() if cols[-2] != "-"}
    for bits, limit in ((4, INT4_GEMV_MAX_M), (8, INT8_GEMV_MAX_M)):
        dot = per_weight[f"int{bits} BM=16 BN=64 BK=128 w=4 s=4"]
        gemv = {label: v for label, v in per_weight.items() if label.startswith(f"gemv int{bits} ")}
        assert {int(label.split("M<=")[1].split()[0]) for label in gemv} == {m for m in (1, 2, 4) if m <= limit}
        assert all(v <= 1.05 * dot for v in gemv.values()), (dot, gemv)
        assert gemv[f"gemv int{bits} M<=1 BN=256 w=2"] < 0.75 * dot, (dot, gemv)
