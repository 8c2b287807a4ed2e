#!/usr/bin/env bash
# The wheels a GPU machine's image lacks (it has torch, triton, transformers, numpy, safetensors,
# tokenizers, jinja2, rich; not these), for its Python 3.12, into .whl/ at the repository root, at
# the versions this checkout's .venv holds. Run on the dev machine, once, before bench/gpu_run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
rm -rf .whl && mkdir .whl
platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
pins=$("${PYTHON:-.venv/bin/python}" - <<'PY'
from importlib.metadata import version
for name in ("structlog", "llguidance", "pydantic", "pydantic-core", "annotated-types", "typing-inspection"):
    print(f"{name}=={version(name)}")
PY
)
for pin in $pins; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl "$pin"
done
du -sh .whl
