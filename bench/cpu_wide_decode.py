"""The CPU decode stack's cost per step at wide batches, against torch's F.linear on the same matrices.

    PYTHONPATH=. .venv/bin/python bench/cpu_wide_decode.py                                  # this tree
    PYTHONPATH=. .venv/bin/python bench/cpu_wide_decode.py --baseline-rev main --repeats 7  # + main

Model: examples/models/pycoder-tiny (Llama, 4 layers, hidden 256, intermediate 768, 8 heads of 32
over 4 KV heads, vocab 4096), loaded by the engine (fp32, one torch thread), its decode stack as the
CPU backend binds it (`CausalLM.decode_stack`). Per batch size B, one decode step of B sequences with
contexts of 96-159 tokens on distinct KV blocks, called directly (`ModelDecodeStack.rows`: embeddings,
every layer, the final norm; no scheduler, no sampling): CPU ms per call (time.process_time, best of
--repeats runs of a loop), and the lm_head after it (`compute_logits`). tok/s = B / (stack + lm_head).
The peer: torch's F.linear over the same 16 matrices in layer order (qkv, o_proj, gate_up, down; B
rows each), and the FLOP rate of the stack (2 x B x its matrices' weights per step). "engine": the
whole engine's plain greedy decode, B prompts of 96-159 random tokens in one generate call: CPU ms
per step as the difference of max_tokens 4 and 36 over 32 steps (best of --repeats each), and B over it.

--baseline-rev REV exports that git revision with `git archive` and runs the same measurement there
in a subprocess (PYTHONPATH at the export), printed beside this tree's.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from revision_run import run_at_revision  # bench/ (the script's folder) is on sys.path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "examples" / "models" / "pycoder-tiny"


def _best(fn, loops: int, repeats: int) -> float:
    """CPU ms per call of fn: the best of `repeats` loops of `loops` calls."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(loops):
            fn()
        best = min(best, (time.process_time() - t0) / loops)
    return 1e3 * best


def _step_inputs(rows: int, block_size: int, num_blocks: int, gen):
    """A decode step of `rows` sequences on distinct blocks: ids, positions, slots, tables, lens."""
    import torch

    lens = torch.tensor([96 + (37 * r) % 64 for r in range(rows)], dtype=torch.int32)
    width = -(-int(lens.max()) // block_size)
    if rows * width > num_blocks:
        raise ValueError(f"{rows} rows need {rows * width} KV blocks; the engine has {num_blocks}")
    tables = torch.randperm(num_blocks, generator=gen)[: rows * width].to(torch.int32).view(rows, width).contiguous()
    positions = lens.long() - 1
    slots = tables[torch.arange(rows), positions // block_size].long() * block_size + positions % block_size
    ids = torch.randint(3, 4096, (rows,), generator=gen)
    return ids, positions, slots, tables, lens


def measure(batches: list[int], repeats: int) -> dict:
    """{"stack" | "lm_head" | "linear": {batch: CPU ms}, "flops": {batch: per step}, "where": path}."""
    import torch
    import torch.nn.functional as F

    import worker
    from worker.engine import Engine, EngineConfig, SamplingParams

    torch.set_num_threads(1)
    engine = Engine.from_pretrained(MODEL, EngineConfig(kv_cache_bytes=96 << 20, max_num_seqs=max(batches),
                                                        num_threads=1))  # fmt: skip
    model = engine.runner.model
    stack = model.decode_stack
    if stack is None:
        raise RuntimeError("the engine did not bind the C decode stack for the reference model")
    k_cache = engine.runner.kv_caches[0][0]
    mats = [w for layer in model.model.layers for w in (layer.self_attn.qkv_proj.weight, layer.self_attn.o_proj.weight,
                                                        layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight)]  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    out: dict = {"stack": {}, "lm_head": {}, "linear": {}, "flops": {}, "engine": {},
                 "where": str(Path(worker.__file__).parent.parent)}  # fmt: skip
    with torch.inference_mode():
        for rows in batches:
            if not stack.fits(rows):
                raise RuntimeError(f"the decode stack does not take {rows} rows here")
            step = _step_inputs(rows, k_cache.shape[1], k_cache.shape[0], gen)
            hidden = stack.rows(*step)
            xs = {k: torch.randn(rows, k, generator=gen) for k in {w.shape[1] for w in mats}}
            loops = max(5, 200 // rows)
            out["stack"][rows] = _best(lambda step=step: stack.rows(*step), loops, repeats)
            out["lm_head"][rows] = _best(lambda hidden=hidden: model.compute_logits(hidden), loops, repeats)
            out["linear"][rows] = _best(lambda xs=xs: [F.linear(xs[w.shape[1]], w) for w in mats], loops, repeats)
            out["flops"][rows] = 2 * rows * sum(w.numel() for w in mats)
    for rows in batches:
        prompts = [torch.randint(3, 4096, (96 + (37 * r) % 64,), generator=gen).tolist() for r in range(rows)]
        cost = {}
        for tokens in (4, 36):
            params = SamplingParams(max_tokens=tokens, ignore_eos=True)
            engine.generate(prompts, params)  # warm
            best = float("inf")
            for _ in range(repeats):
                t0 = time.process_time()
                engine.generate(prompts, params)
                best = min(best, time.process_time() - t0)
            cost[tokens] = best
        out["engine"][rows] = 1e3 * (cost[36] - cost[4]) / 32
    return out


def measure_revision(rev: str, args: argparse.Namespace) -> dict:
    """The same measurement on `git archive rev`, in a subprocess whose `worker` is that export."""
    result = run_at_revision(rev, __file__, ["--json", "--repeats", str(args.repeats), "--batches",
                                             *map(str, args.batches)])  # fmt: skip
    return {key: {int(b): v for b, v in val.items()} if isinstance(val, dict) else val for key, val in result.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    ap.add_argument("--repeats", type=int, default=5, help="loops per point; the fastest is kept")
    ap.add_argument("--baseline-rev", default=None, help="a git revision to measure the same way, side by side")
    ap.add_argument("--json", action="store_true", help="print one JSON line (used for the baseline run)")
    args = ap.parse_args()
    if args.json:
        print(json.dumps(measure(args.batches, args.repeats)))
        return
    base = measure_revision(args.baseline_rev, args) if args.baseline_rev else None
    now = measure(args.batches, args.repeats)
    if not now["where"].startswith(str(ROOT)):
        raise RuntimeError(f"worker was imported from {now['where']}, not this tree: run with PYTHONPATH={ROOT}")
    print(f"CPU ms per decode step, {MODEL.name} (fp32, 1 thread), contexts 96-159; best of {args.repeats}")
    head = f"{'batch':>5} {'stack':>7} {'GF/s':>5} {'lm_head':>7} {'tok/s':>7} {'F.linear':>8} {'GF/s':>5} {'engine':>6} {'tok/s':>6}"
    if base:
        head += f" | {'base stack':>10} {'base tok/s':>10} {'stack x':>7} {'base engine':>11} {'tok/s':>6}"
    print(head + (f"   (base = {args.baseline_rev})" if base else ""))
    print(" " * 6 + "(stack: the decoder layers' call; F.linear: the same 16 matrices alone through torch; "
          "engine: a whole plain greedy decode step)")  # fmt: skip
    for b in args.batches:
        s, lm, lin, fl = now["stack"][b], now["lm_head"][b], now["linear"][b], now["flops"][b]
        eng = now["engine"][b]
        line = (f"{b:>5} {s:>7.3f} {fl / s / 1e6:>5.0f} {lm:>7.3f} {1e3 * b / (s + lm):>7.0f} {lin:>8.3f} "
                f"{fl / lin / 1e6:>5.0f} {eng:>6.2f} {1e3 * b / eng:>6.0f}")  # fmt: skip
        if base:
            bs, blm, beng = base["stack"][b], base["lm_head"][b], base["engine"][b]
            line += f" | {bs:>10.3f} {1e3 * b / (bs + blm):>10.0f} {bs / s:>6.2f}x {beng:>11.2f} {1e3 * b / beng:>6.0f}"
        print(line)


if __name__ == "__main__":
    main()
