"""The lm_head inside the whole-layer C decode call against the same head after it.

    .venv/bin/python bench/head_in_stack.py                       # fp32, int8 and int4 g32, batches 1 and 32
    .venv/bin/python bench/head_in_stack.py --batches 1 --gen 64 --rounds 3 --clock cpu

The model is bench/llama_cpp_decode.py's (make_demo_model size "medium": a random 29.4M-parameter
Llama, its 4096 x 512 head about 8% of the weights), in fp32 or quantized with its head the same way
(`freight quantize --method int8 --lm-head`, `--method int4-rtn --group-size 32 --lm-head`). One
engine, one thread; "in call" is the default (ModelDecodeStack.logits: final norm and head in the
stack's call), "after" unbinds the head from the stack's step (`stack.head = None`: the stack's
hidden states, then Backend.project on the head: the same integer kernel, or the same packed copy
of an fp32 head, and the same floats).
Decode time per step is a run generating --gen tokens minus a run generating 1 (the same prompts,
prefix caching off) over gen - 1 steps; the two sides alternate round by round and each keeps its
fastest round. --clock cpu counts the process's CPU seconds (for a machine whose other users take
the cores away) instead of wall time.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

FORMATS = {"fp32": (None, 0), "int8": ("int8", 128), "int4": ("int4-rtn", 32)}


def decode_step_seconds(engine, prompts: list[list[int]], gen: int, clock) -> float:
    from worker.engine import SamplingParams

    timed = {}
    for n in (1, gen):
        t0 = clock()
        engine.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True))
        timed[n] = clock() - t0
    return (timed[gen] - timed[1]) / (gen - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default="fp32,int8,int4", help="comma-separated: fp32, int8, int4 (group 32)")
    ap.add_argument("--batches", default="1,32", help="sequences per batch, comma-separated")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens per sequence")
    ap.add_argument("--gen", type=int, default=64, help="generated tokens per sequence")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per side; the fastest is kept")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = ap.parse_args()
    from worker.demo_model import make_demo_model
    from worker.engine import Engine, EngineConfig
    from worker.engine.quant.checkpoint import QuantizeSpec, quantize_checkpoint

    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        model = make_demo_model(Path(tmp) / "fp32", "llama", size="medium")
        print(f"decode ms per step ({args.clock} clock, one thread, best of {args.rounds} alternating rounds)")
        print(f"{'format':>6} {'batch':>5} {'head after':>11} {'head in call':>13} {'ratio':>7}")
        for name in args.formats.split(","):
            method, group = FORMATS[name]
            path = model if method is None else Path(tmp) / name
            if method is not None:
                quantize_checkpoint(model, path, QuantizeSpec(method=method, group_size=group, lm_head=True))
            engine = Engine.from_pretrained(path, EngineConfig(
                kv_cache_bytes=1 << 28, enable_prefix_caching=False, num_threads=1, backend="cpu",
                max_num_seqs=max(batches), max_num_batched_tokens=max(2048, max(batches))))  # fmt: skip
            stack = engine.runner.model.decode_stack
            head = stack.head
            assert head is not None and stack.head_takes(), "the head is not bound to the stack"
            rng = random.Random(0)
            for b in batches:
                prompts = [[rng.randrange(3, engine.vocab_size) for _ in range(args.prompt)] for _ in range(b)]
                best = {"after": float("inf"), "in call": float("inf")}
                for _ in range(args.rounds):
                    for side in best:
                        stack.head = head if side == "in call" else None
                        best[side] = min(best[side], decode_step_seconds(engine, prompts, args.gen, clock))
                stack.head = head
                after, fused = best["after"] * 1e3, best["in call"] * 1e3
                print(f"{name:>6} {b:>5} {after:>11.3f} {fused:>13.3f} {after / fused:>6.2f}x")


if __name__ == "__main__":
    main()
