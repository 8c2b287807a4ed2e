"""Write the small datasets the example suites read (examples/evals/suites.toml).

    python examples/evals/make_dataset.py [--out examples/evals/data] [--rows 40]

arith.parquet: id, prompt, answer (a number): generation metrics (numeric, exact_match, regex).
choices.parquet: id, prompt (context), options (list of strings), answer (index of the right one):
the likelihood multiple-choice metric. Deterministic: the same rows on every call.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

OPPOSITES = [
    ("hot", "cold"),
    ("up", "down"),
    ("left", "right"),
    ("day", "night"),
    ("open", "closed"),
    ("fast", "slow"),
    ("early", "late"),
    ("full", "empty"),
    ("heavy", "light"),
    ("wet", "dry"),
]


def arithmetic(rows: int, rng: random.Random) -> pa.Table:
    ids, prompts, answers = [], [], []
    for i in range(rows):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        ids.append(f"arith-{i:04d}")
        prompts.append(f"Question: what is {a} + {b}?\nAnswer:")
        answers.append(str(a + b))
    return pa.table({"id": ids, "prompt": prompts, "answer": answers})


def choices(rows: int, rng: random.Random) -> pa.Table:
    ids, prompts, options, answers = [], [], [], []
    words = [w for pair in OPPOSITES for w in pair]
    for i in range(rows):
        word, opposite = OPPOSITES[i % len(OPPOSITES)]
        distractors = rng.sample([w for w in words if w not in (word, opposite)], 2)
        opts = [opposite, *distractors]
        rng.shuffle(opts)
        ids.append(f"opp-{i:04d}")
        prompts.append(f"The opposite of {word} is")
        options.append(opts)
        answers.append(opts.index(opposite))
    return pa.table(
        {"id": ids, "prompt": prompts, "options": options, "answer": pa.array(answers, pa.int64())}
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data")
    parser.add_argument("--rows", type=int, default=40)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    pq.write_table(arithmetic(args.rows, rng), args.out / "arith.parquet")
    pq.write_table(choices(args.rows, rng), args.out / "choices.parquet")
    print(f"wrote {args.out / 'arith.parquet'} and {args.out / 'choices.parquet'} ({args.rows} rows each)")


if __name__ == "__main__":
    main()
