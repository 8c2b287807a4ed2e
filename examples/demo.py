"""`make demo`: a real freight job end to end, embedded in this process.

Makes the demo dataset and (unless examples/models/pycoder-tiny exists) a random demo model, runs
`freight run` through the same code path as the command line, then prints the first results and the
cost table.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # run from a checkout without installing

from demo_data import make_demo_dataset  # noqa: E402

from jobs.cli import app  # noqa: E402

TRAINED_MODEL = HERE / "models" / "pycoder-tiny"


def freight(*args: str) -> None:
    """Run one `freight` command in process; stop the demo if it fails."""
    code = app(list(args), standalone_mode=False)
    if code:
        sys.exit(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path(".demo"))
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    work: Path = args.workdir.resolve()
    dataset = make_demo_dataset(work / "prompts.parquet")
    if (TRAINED_MODEL / "config.json").is_file():
        model = TRAINED_MODEL
    else:
        model = work / "model"
        if not (model / "config.json").is_file():
            freight("demo-model", str(model), "--arch", "llama")
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)  # the demo's own output: a fresh job every time
    print(f"dataset {dataset}\nmodel   {model}\noutput  {out}\n", flush=True)
    freight(
        "run",
        str(dataset),
        "--model",
        str(model),
        "--output",
        str(out),
        "--id-column",
        "id",
        "--max-tokens",
        str(args.max_tokens),
        "--shard-rows",
        "12",
    )
    freight("results", str(out), "--head", "6")
    freight("cost", str(out))


if __name__ == "__main__":
    main()
