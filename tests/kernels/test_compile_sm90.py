"""The compiled path, which the interpreter never exercises: every kernel at its wrapper's default
launch config compiles for Hopper (sm_90) with ptxas, fits in shared memory, does not spill, and
its dots become tensor-core instructions. No GPU needed (bench/compile_check.py)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_default_configs_compile_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "compile_check.py"), "--defaults"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.split("  ")[0].strip(): line.split() for line in proc.stdout.splitlines()[1:] if line.strip()}
    assert len(rows) == 11, proc.stdout
    for label, cols in rows.items():
        if label.startswith(("decode BN", "prefill", "int4", "int8")):
            assert "mma" in cols or "wgmma" in cols, f"{label}: no tensor-core dot\n{proc.stdout}"
