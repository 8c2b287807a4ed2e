#!/usr/bin/env bash
# The GPU check as one command on a GPU machine, run from the repository root:
#
#   bench/gpu_wheels.sh     # on the dev machine, first: the wheels the GPU image lacks, into .whl/
#   bench/gpu_run.sh        # on the GPU machine, with .whl/ copied beside the checkout (< 10 minutes)
#
# It installs the wheels in .whl/, prints the card and the versions, then runs bench/gpu_check.py
# (exactness on the device first, then every kernel against its reference and its roofline, the
# launch sweep, the engine end to end); the JSON report and the log land in $OUT when it is set,
# else /tmp/gpu-check. Extra arguments go to gpu_check.py.
# `bench/gpu_run.sh --dry-run` runs the same on this machine's CPU with .venv's Python (Triton
# interpreted, tiny shapes): it checks the plumbing, its speeds mean nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
log="$out/gpu_check.log"
if [[ " $* " == *" --dry-run "* ]]; then
  python=${PYTHON:-.venv/bin/python}
else
  python=python3
  $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || { echo "error: no wheels in .whl/: run bench/gpu_wheels.sh before the device call" >&2; exit 2; }
  export PYTHONPATH=/tmp/site
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$log"
fi
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
$python -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__,
"transformers", transformers.__version__)' 2>&1 | tee -a "$log"
timeout 570 $python bench/gpu_check.py "$out/gpu_check.json" "$@" 2>&1 | tee -a "$log"
exit "${PIPESTATUS[0]}"
