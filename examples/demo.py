"""`make demo`: a real freight job end to end, embedded in this process.

Makes the demo dataset and (unless examples/models/pycoder-tiny exists) a random demo model, runs
`freight run` through the same code path as the command line, then prints the first results, a few
completions in full and the cost table. It says first what the model is: a few million parameters
trained for minutes on a CPU write Python that looks right, not programs that work.

A second job shows structured output: one JSON object per code snippet, shaped by a JSON schema
(`--json-schema`), printed as a table from the results' `parsed` column. The shape is guaranteed by
the engine; what a model this small puts in it is a guess.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # run from a checkout without installing

from demo_data import EXTRACT_SCHEMA, SNIPPETS, make_demo_dataset, make_extract_dataset  # noqa: E402

from freight_cli import app  # noqa: E402

TRAINED_MODEL = HERE / "models" / "pycoder-tiny"
# Sampling that suits a model this small: greedy decoding repeats itself (every docstring the same
# sentence), a temperature of 0.7 breaks the syntax; 0.4 over the likeliest 90% of the mass reads
# best over the 32 demo prompts (tests/jobs/test_demo.py's `reads_as_python` counts the completions
# that parse). Each row is seeded from the job seed and its id, so a rerun prints the same text.
TEMPERATURE = "0.4"
TOP_P = "0.9"
SHOWN_IN_FULL = ("fn-00", "fn-13", "code-01")
EXTRACT_MAX_TOKENS = 96  # room for the longest object EXTRACT_SCHEMA allows, in this model's tokens


def freight(*args: str) -> None:
    """Run one `freight` command in process; stop the demo if it fails."""
    code = app(list(args), standalone_mode=False)
    if code:
        sys.exit(code)


def describe(model: Path) -> str:
    """What the model is, in a sentence a newcomer can calibrate the output against."""
    training = model / "training.json"
    if not training.is_file():
        return "a random demo checkpoint (`freight demo-model`): it writes noise, the plumbing is real"
    info = json.loads(training.read_text())
    runs = list(_runs(info))  # a fine-tune or a grown model records the runs it started from
    minutes = round(sum(r.get("train_seconds", 0) + (r.get("copy_warmup") or {}).get("seconds", 0) for r in runs) / 60)
    steps = sum((r.get("config") or {}).get("steps", 0) + (r.get("copy_warmup") or {}).get("steps", 0) for r in runs)
    how = f"{steps:,} steps" + (f" in {len(runs)} runs" if len(runs) > 1 else "")
    return (
        f"pycoder-tiny, a {info.get('parameters', 0) / 1e6:.1f}M-parameter Llama that "
        f"bench/train_reference.py trained on one CPU core in {minutes} minutes ({how}) on "
        "the Python standard library. It writes Python that reads plausibly, not programs that work: "
        "real models are 1,000 to 100,000 times its size."
    )


def _runs(info: dict):
    """training.json and, in turn, those of the checkpoints it started from (--init-from, --grow-from)."""
    while info:
        yield info
        info = (info.get("init_from") or info.get("grow_from") or {}).get("training") or {}


def show_in_full(out: Path, dataset: Path, ids: tuple[str, ...]) -> None:
    """A few prompts with their completions, as code (the results table shows one line each)."""
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    prompts = {r["id"]: r["prompt"] for r in pq.read_table(dataset).to_pylist()}
    rows = pads.dataset(out / "shards").to_table()
    completions = {r["id"]: r["completion"] for r in rows.to_pylist()}
    bold, plain = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("", "")
    for row_id in ids:
        if row_id in completions:
            print(f"--- {row_id}: the prompt, then what the model wrote after it ---")
            print(f"{prompts[row_id]}{bold}{completions[row_id] or ''}{plain}\n", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path(".demo"))
    parser.add_argument("--max-tokens", type=int, default=48)
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
    print(
        f"dataset  {dataset}\nmodel    {model}\n         {describe(model)}\n"
        f"sampling temperature {TEMPERATURE}, top-p {TOP_P}, up to {args.max_tokens} tokens a row\n"
        f"output   {out}\n",
        flush=True,
    )
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
        "--temperature",
        TEMPERATURE,
        "--top-p",
        TOP_P,
        "--shard-rows",
        "12",
    )
    freight("results", str(out), "--head", "6")
    show_in_full(out, dataset, SHOWN_IN_FULL)
    freight("cost", str(out))
    extract(work, model)


def extract(work: Path, model: Path) -> None:
    """The structured-output job: a JSON object per snippet, printed as a table. Exits 1 naming the
    cause when no row produced one."""
    import pyarrow.dataset as pads
    from rich.console import Console
    from rich.table import Table

    dataset = make_extract_dataset(work / "snippets.parquet")
    schema = work / "extract_schema.json"
    schema.write_text(json.dumps(EXTRACT_SCHEMA, indent=2) + "\n")
    out = work / "extract"
    shutil.rmtree(out, ignore_errors=True)
    print(
        f"\nstructured output: one JSON object per code snippet, shaped by {schema}\n"
        f"  {json.dumps(EXTRACT_SCHEMA)}\n",
        flush=True,
    )
    freight("run", str(dataset), "--model", str(model), "--output", str(out), "--id-column", "id",
            "--max-tokens", str(EXTRACT_MAX_TOKENS), "--json-schema", str(schema))  # fmt: skip
    rows = {r["id"]: r for r in pads.dataset(out / "shards").to_table().to_pylist()}
    if not any(r["parsed"] for r in rows.values()):
        first = next(iter(rows.values()))
        cause = first["error"] or f"finish_reason {first['finish_reason']}"
        print(f"error: the structured-output job produced no JSON object ({cause})", file=sys.stderr)
        sys.exit(1)
    table = Table(title="what the model extracted (the shape is enforced, the content is a tiny model's guess)",
                  title_justify="left")  # fmt: skip
    for name in ("id", "function", "args", "returns_value", "finish"):
        table.add_column(name)
    for row_id in SNIPPETS:
        row = rows[row_id]
        if row["parsed"] is None:  # ran out of tokens, or failed: say which
            table.add_row(row_id, "-", "-", "-", row["error"] or row["finish_reason"])
            continue
        value = json.loads(row["parsed"])
        table.add_row(row_id, value["function"], ", ".join(value["args"]), str(value["returns_value"]).lower(),
                      row["finish_reason"])  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
