"""Run a bench script's own measurement on another git revision (--baseline-rev): `git archive` of the
revision into a temporary folder, the script run there in a subprocess whose PYTHONPATH is that export
(so its `worker` package is the revision's), its last stdout line read as JSON. The script must print
`{"where": <its worker package's path>, ...}` under --json; a run that imported another tree's worker
is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_at_revision(rev: str, script: str | Path, args: list[str]) -> dict:
    """`script args` (the bench's --json mode) run on `git archive rev`; its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
        tar_path = Path(tmp) / "rev.tar"
        tar_path.write_bytes(archive)
        export = Path(tmp) / "src"
        with tarfile.open(tar_path) as tar:
            tar.extractall(export, filter="data")
        env = {**os.environ, "PYTHONPATH": str(export)}
        out = subprocess.run([sys.executable, str(Path(script).resolve()), *args], check=True, capture_output=True,
                             text=True, env=env, cwd=export).stdout  # fmt: skip
        result = json.loads(out.strip().splitlines()[-1])
        if not result["where"].startswith(str(export)):
            raise RuntimeError(f"the baseline run imported worker from {result['where']}, not the export")
        return result
