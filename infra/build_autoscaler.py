"""Build the autoscaler Lambda's package folder: jobs/autoscale from this repository plus the
pure-Python packages it needs (redis, structlog), copied from the Python that runs this script.

    python infra/build_autoscaler.py            # -> infra/build/autoscaler/ (Terraform zips it)
    python infra/build_autoscaler.py --out DIR

Run it with the project's environment (`make install`, then `.venv/bin/python`), so the copied
packages are exactly the pinned versions. boto3 is not copied: the Lambda Python runtime has it.
Compiled extensions are refused: the Lambda runs on another platform than the build machine.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "infra" / "build" / "autoscaler"
# the modules of this repository the handler imports, and nothing more (jobs/ stays light)
SOURCES = ["jobs/__init__.py", "jobs/log.py", "jobs/redact.py", "jobs/progress.py", "jobs/live_state.py",
           "jobs/leases.py", "jobs/autoscale"]
DEPENDENCIES = ["redis", "structlog"]
COMPILED = (".so", ".pyd", ".dylib")


def _ignore(_dir: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo"))]


def copy_dependency(name: str, out: Path) -> str:
    """Copy an installed pure-Python package and its dist-info; returns its version."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"{name} is not installed in {sys.executable}: run `make install` and use .venv/bin/python"
        )
    src = Path(next(iter(spec.submodule_search_locations)))
    compiled = [p for p in src.rglob("*") if p.suffix in COMPILED]
    if compiled:
        raise SystemExit(
            f"{name} has compiled extensions ({compiled[0].name}); the Lambda package must be pure Python"
        )
    shutil.copytree(src, out / name, ignore=_ignore)
    dist = importlib.metadata.distribution(name)
    # the .dist-info folder: licence and metadata travel with the code
    infos = {f.parts[0] for f in dist.files or () if f.parts[0].endswith(".dist-info")}
    for info in infos:
        shutil.copytree(Path(str(dist.locate_file(info))), out / info, ignore=_ignore)
    return dist.version


def build(out: Path) -> dict[str, str]:
    """Write the package folder `out` (replacing it); returns {package: version}."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for rel in SOURCES:
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, out / rel, ignore=_ignore)
        else:
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out / rel)
    versions = {name: copy_dependency(name, out) for name in DEPENDENCIES}
    (out / "BUILD.json").write_text(
        json.dumps({"sources": SOURCES, "dependencies": versions}, indent=2) + "\n"
    )
    return versions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"package folder (default {DEFAULT_OUT})"
    )
    args = parser.parse_args()
    versions = build(args.out.resolve())
    print(f"autoscaler package in {args.out}: " + ", ".join(f"{k} {v}" for k, v in versions.items()))


if __name__ == "__main__":
    main()
