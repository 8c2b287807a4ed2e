"""A thinking budget against unbounded thinking, and grammars after thinking against free answers.

    .venv/bin/python bench/reasoning_budget.py                       # 256 rows, demo "small" qwen3
    .venv/bin/python bench/reasoning_budget.py --rows 32 --size tiny # a quick look

Workload: --rows chat rows on the qwen3 demo checkpoint (Qwen3's template and `<think>` tokens;
random weights), each prompt ending in an open `<think>` block as R1-style templates end theirs, so
every row thinks from its first token and, the weights being random, never stops thinking on its own.
Greedy, one torch thread, all rows in one engine batch as a shard runs them, each run on a fresh
engine in this process:

- "unbounded": no budget, the answer held to a small JSON schema: every row thinks until
  --max-tokens (finish "length": no answer);
- "budget N": --budget thinking tokens, then the engine writes `</think>\\n\\n` and the answer follows
  under the schema (the budget's saving is the unbounded run's tokens and CPU time over these);
- "budget N, free answer": the same thinking, the answer unconstrained and EOS ignored, each row
  cut at the constrained run's mean completion length: the same work without the grammar, the peer
  of the constrained rows' throughput (target: >= 0.9x).

Reported: completion and reasoning tokens, rows that stopped with a valid answer (json.loads and the
schema's keys), CPU seconds of `generate` (process time: the work done, whatever else runs on the
machine), wall seconds and completion tokens per CPU second.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from contracts.constraint import Constraint
from contracts.reasoning import THINK, split_output
from worker.demo_model import SIZES, make_demo_model
from worker.engine import Engine, EngineConfig, SamplingParams

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999},
          "sure": {"type": "boolean"}}, "required": ["answer", "sure"]}  # fmt: skip
QUESTIONS = ["What is {a} + {b}?", "Is {a} larger than {b}?", "How many days are in {a} weeks?",
             "Name a number between {b} and {a}.", "What is {a} times {b}?"]  # fmt: skip


def prompts(engine: Engine, rows: int) -> list[str]:
    tok = engine.tokenizer
    out = []
    for i in range(rows):
        question = QUESTIONS[i % len(QUESTIONS)].format(a=17 + i, b=3 + i % 11)
        out.append(tok.apply_chat_template([{"role": "user", "content": question}]) + "<think>\n")
    return out


def run(path: Path, texts: list[str], params: SamplingParams) -> dict:
    engine = Engine.from_pretrained(path, EngineConfig(max_num_seqs=256, num_threads=1))
    t0, c0 = time.perf_counter(), time.process_time()
    outs = engine.generate(texts, params)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    tokens = engine.tokenizer.reasoning_tokens(THINK)
    completion = reasoning = valid = 0
    for out in outs:
        split = split_output(tokens, out.prompt_token_ids, out.token_ids, lambda ids: engine.tokenizer.decode(list(ids)))
        completion += len(out.token_ids)
        reasoning += split.reasoning_tokens
        if out.finish_reason == "stop" and params.constraint is not None:
            value = json.loads(split.answer)
            valid += set(value) == {"answer", "sure"}
    return {"completion": completion, "reasoning": reasoning, "valid": valid, "cpu": cpu, "wall": wall,
            "rate": completion / cpu}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--size", default="small", choices=list(SIZES))
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        path = make_demo_model(Path(tmp) / "qwen3", "qwen3", size=args.size)
        texts = prompts(Engine.from_pretrained(path, EngineConfig(num_threads=1)), args.rows)
        schema = Constraint.json_schema(SCHEMA)
        base = SamplingParams(max_tokens=args.max_tokens, reasoning=THINK, constraint=schema)
        unbounded = run(path, texts, base)
        budget = run(path, texts, base.updated(reasoning_budget=args.budget))
        mean = round(budget["completion"] / args.rows)
        free = run(path, texts, base.updated(reasoning_budget=args.budget, constraint=None, max_tokens=mean,
                                             ignore_eos=True))  # fmt: skip
    print(f"{args.rows} rows, demo {args.size} qwen3, max_tokens {args.max_tokens}, budget {args.budget}\n")
    print("| run | completion tokens | reasoning tokens | valid answers | CPU s | wall s | tokens / CPU s | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r, ratio, valid in (
        ("unbounded", unbounded, "", str(unbounded["valid"])),
        (f"budget {args.budget}", budget, f"**{unbounded['cpu'] / budget['cpu']:.2f}x** less CPU", str(budget["valid"])),
        (f"budget {args.budget}, free answer", free, "", "-"),
    ):
        print(f"| {name} | {r['completion']:,} | {r['reasoning']:,} | {valid} | {r['cpu']:.2f} | {r['wall']:.2f} "
              f"| {r['rate']:,.0f} | {ratio} |")  # fmt: skip
    print(f"\nconstrained-after-thinking throughput vs free answers: **{budget['rate'] / free['rate']:.2f}x** "
          f"(tokens / CPU s); the budget saves {1 - budget['completion'] / unbounded['completion']:.0%} of the tokens")


if __name__ == "__main__":
    main()
