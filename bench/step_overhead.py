"""The engine's host cost per decode step, on a model whose compute is negligible.

    .venv/bin/python bench/step_overhead.py                         # this tree
    .venv/bin/python bench/step_overhead.py --baseline-rev main     # + the same measurement of main
    .venv/bin/python bench/step_overhead.py --baseline-rev main --rounds 5  # alternating rounds, steadier
    .venv/bin/python bench/step_overhead.py --batches 1 256 --repeats 5
    .venv/bin/python bench/step_overhead.py --batches 256 --sampling '{"presence_penalty": 0.5}'  # rows with a setting

Model: a random Llama with 2 layers, hidden 64, vocab 512 (the demo tokenizer's ids below 512);
prompts of 16 random tokens, greedy, EOS ignored, one torch thread. A decode step's cost is measured
as a difference, so prefill, ordering and output building cancel out: the CPU time of `generate` with
max_tokens = SHORT + STEPS minus that with max_tokens = SHORT, divided by STEPS (best of --repeats
each, alternating). CPU seconds (time.process_time), so other load on the machine costs little.

--baseline-rev REV exports that git revision with `git archive` into a temporary folder and runs the
same measurement there in a subprocess (PYTHONPATH at the export, so its `worker` package is used);
the table then shows both side by side, and the ratio.
--batch1-medium adds batch-1 decode on bench/engine_vs_hf.py's model (demo size "medium", fp32): ms
per generated token, by the same difference, and that model's projections alone: through torch's
F.linear, through the engine's C GEMV, and a plain in-order read of the same bytes (the bound).
--rounds N alternates N rounds of this tree and the baseline and keeps each side's fastest: on a
shared machine the speed drifts over minutes, which a single run of each side in turn reads as a
difference between them.
--host-only replaces the model's forward and logits by stubs returning fixed tensors of the right
shapes (tokens are then garbage but the counts are right): the engine's host work alone, steadier
than the difference of two noisy numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from revision_run import run_at_revision  # bench/ (the script's folder) is on sys.path

SHORT = 4  # max_tokens of the reference run
STEPS = 64  # extra decode steps of the measured run
VOCAB = 512


def negligible_model(out: Path) -> Path:
    """The demo "tiny" Llama (2 layers, hidden 64) cut to a 512-token vocabulary."""
    import torch
    from safetensors.torch import load_file, save_file

    from worker.demo_model import make_demo_model

    path = make_demo_model(out, "llama", size="tiny")
    weights = load_file(path / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        weights[name] = weights[name][:VOCAB].contiguous()
    save_file({k: v.to(torch.float32) for k, v in weights.items()}, str(path / "model.safetensors"),
              {"format": "pt"})  # fmt: skip
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(vocab_size=VOCAB, eos_token_id=2, bos_token_id=0)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


class ModelClock:
    """CPU seconds spent inside the model (forward + logits, and the decode stack's layers + lm_head
    call where it takes a step), to split a step into model and host."""

    def __init__(self, model) -> None:
        self.seconds = 0.0
        for name in ("forward", "compute_logits"):
            inner = getattr(model, name)
            setattr(model, name, self._timed(inner))
        stack = getattr(model, "decode_stack", None)  # absent on older revisions
        if stack is not None and hasattr(stack, "logits"):
            stack.logits = self._timed(stack.logits)

    def _timed(self, fn):
        def timed(*args, **kwargs):
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.process_time() - t0

        return timed


def stub_model(model) -> None:
    """The model's forward and logits replaced by slices of fixed tensors (works on any revision:
    the engine calls model(input_ids, positions, meta, kv_caches[, stacked]) and
    model.compute_logits(hidden)); the decode stack is unbound so no step bypasses the stubs."""
    import torch

    cfg = model.cfg
    hidden, logits = torch.zeros(8192, cfg.hidden_size), torch.randn(8192, cfg.vocab_size)
    if getattr(model, "decode_stack", None) is not None:
        model.decode_stack = None

    def forward(input_ids, positions, meta, kv_caches, stacked=None):
        rows = getattr(meta, "output_rows", None)
        return hidden[: input_ids.shape[0] if rows is None else rows.shape[0]]

    model.forward = forward
    model.compute_logits = lambda h: logits[: h.shape[0]]


def decode_cost(engine, prompts: list[list[int]], repeats: int, steps: int = STEPS,
                sampling: dict | None = None) -> tuple[float, float]:  # fmt: skip
    """(CPU seconds per decode step, of which inside the model) of `engine` on `prompts` (see the
    module docstring); `sampling`: more SamplingParams fields for every row (penalties, seed, ...)."""
    from worker.engine import SamplingParams

    clock = ModelClock(engine.runner.model)
    short = SamplingParams(max_tokens=SHORT, ignore_eos=True, **(sampling or {}))
    long = SamplingParams(max_tokens=SHORT + steps, ignore_eos=True, **(sampling or {}))
    engine.generate(prompts, long)  # warm-up: kernels built, caches touched
    best = {short: (float("inf"), 0.0), long: (float("inf"), 0.0)}
    for _ in range(repeats):
        for params in (short, long):
            model0, t0 = clock.seconds, time.process_time()
            outs = engine.generate(prompts, params)
            spent = time.process_time() - t0
            if any(len(o.token_ids) != params.max_tokens for o in outs):
                raise RuntimeError("the engine generated the wrong number of tokens")
            best[params] = min(best[params], (spent, clock.seconds - model0))
    return (best[long][0] - best[short][0]) / steps, (best[long][1] - best[short][1]) / steps


def projections_alone(model, repeats: int) -> dict:
    """One token's projections and lm_head alone over the model's own weights, in layer order (best of
    `repeats`, ms): "torch_ms" through F.linear (M=1), "gemv_ms" through the CPU backend's C GEMV (None
    on revisions without it), "read_ms" a plain in-order read of the same bytes (the streaming bound;
    None likewise), and "weight_mb" the bytes they read."""
    import torch

    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights = list({id(w): w for w in weights}.values())  # a tied lm_head once
    inputs = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights}
    try:
        from kernels.cpu.gemv import NativeGemv

        gemv = NativeGemv()
    except ImportError:
        gemv = None
    cases = {"torch_ms": lambda: [torch.nn.functional.linear(inputs[w.shape[1]], w) for w in weights]}
    if gemv is not None:
        cases["gemv_ms"] = lambda: [gemv(inputs[w.shape[1]], w, checked=True) for w in weights]
        cases["read_ms"] = lambda: [gemv.stream_read(w) for w in weights]
    best = {name: float("inf") for name in cases}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, run in cases.items():  # alternating: the same machine state for each
                t0 = time.process_time()
                for _ in range(10):
                    run()
                best[name] = min(best[name], (time.process_time() - t0) / 10)
    out: dict = {name: 1e3 * best[name] if name in best else None for name in ("torch_ms", "gemv_ms", "read_ms")}
    out["weight_mb"] = sum(w.numel() * w.element_size() for w in weights) / 1e6
    return out


def measure(batches: list[int], repeats: int, batch1_medium: bool, host_only: bool = False,
            sampling: dict | None = None) -> dict:  # fmt: skip
    """{"steps": {batch: ms per step}, "batch1_medium_ms": ms per token or None, "where": path}."""
    import torch

    import worker
    from worker.engine import Engine, EngineConfig

    torch.set_num_threads(1)
    result: dict = {"steps": {}, "model": {}, "batch1_medium_ms": None,
                    "where": str(Path(worker.__file__).parent.parent)}  # fmt: skip
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = negligible_model(Path(tmp) / "tiny")
        for batch in batches:
            engine = Engine.from_pretrained(
                path, EngineConfig(kv_cache_bytes=256 << 20, max_num_seqs=max(batch, 1), num_threads=1)
            )
            prompts = [[rng.randrange(3, VOCAB) for _ in range(16)] for _ in range(batch)]
            if host_only:
                stub_model(engine.runner.model)
            step, model = decode_cost(engine, prompts, repeats, sampling=sampling)
            result["steps"][batch], result["model"][batch] = 1e3 * step, 1e3 * model
        if batch1_medium:
            from worker.demo_model import make_demo_model

            medium = make_demo_model(Path(tmp) / "medium", "llama", size="medium")
            engine = Engine.from_pretrained(medium, EngineConfig(kv_cache_bytes=1 << 28, num_threads=1))
            prompt = [[rng.randrange(3, 4000) for _ in range(16)]]
            result["batch1_medium_ms"] = 1e3 * decode_cost(engine, prompt, repeats, steps=48)[0]
            result["projections"] = projections_alone(engine.runner.model, repeats)
    return result


def fastest(results: list[dict]) -> dict:
    """One result of several rounds: per batch the fastest round's step and model times (a round's
    pair is kept together, so host = step - model stays one measurement)."""
    best = dict(results[0])
    for key in ("steps", "model"):
        best[key] = dict(best[key])
    for result in results[1:]:
        for batch, ms in result["steps"].items():
            if ms < best["steps"][batch]:
                best["steps"][batch], best["model"][batch] = ms, result["model"][batch]
        if result.get("batch1_medium_ms") is not None and result["batch1_medium_ms"] < best["batch1_medium_ms"]:
            best["batch1_medium_ms"] = result["batch1_medium_ms"]
    return best


def measure_revision(rev: str, args: argparse.Namespace) -> dict:
    """The same measurement on `git archive rev`, in a subprocess whose `worker` is that export."""
    flags = (["--batch1-medium"] if args.batch1_medium else []) + (["--host-only"] if args.host_only else []) + (
        ["--sampling", args.sampling] if args.sampling else [])  # fmt: skip
    return run_at_revision(rev, __file__, ["--json", "--repeats", str(args.repeats), "--batches",
                                           *map(str, args.batches), *flags])  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--repeats", type=int, default=3, help="runs per point; the fastest is kept")
    ap.add_argument("--baseline-rev", default=None, help="a git revision to measure the same way, side by side")
    ap.add_argument("--batch1-medium", action="store_true", help="add batch-1 ms/token on the 29M bench model")
    ap.add_argument("--host-only", action="store_true", help="stub the model: the engine's host work alone")
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternating rounds of this tree and --baseline-rev; each side's fastest is kept")
    ap.add_argument("--json", action="store_true", help="print one JSON line (used for the baseline run)")
    ap.add_argument("--sampling", default=None, metavar="JSON",
                    help='more SamplingParams fields for every row, e.g. \'{"repetition_penalty": 1.1}\'')
    args = ap.parse_args()
    sampling = json.loads(args.sampling) if args.sampling else None
    if args.host_only and args.batch1_medium:
        ap.error("--host-only stubs the model; run --batch1-medium separately")
    if args.json:
        print(json.dumps(measure(args.batches, args.repeats, args.batch1_medium, args.host_only, sampling)))
        return
    bases, nows = [], []
    for _ in range(args.rounds):  # alternating, so drift of the machine's speed reaches both sides
        if args.baseline_rev:
            bases.append(measure_revision(args.baseline_rev, args))
        nows.append(measure(args.batches, args.repeats, args.batch1_medium, args.host_only, sampling))
    base, now = (fastest(bases) if bases else None), fastest(nows)
    print(f"CPU per decode step, negligible model (Llama 2 layers, hidden 64, vocab {VOCAB}), 16-token prompts, "
          f"{'sampling ' + args.sampling if args.sampling else 'greedy'}, 1 thread; best of {args.repeats}"
          f" x {args.rounds} alternating rounds"
          + ("; MODEL STUBBED (host work only)" if args.host_only else ""))  # fmt: skip
    print("(model = CPU ms inside the model's forward and logits or the decode stack's call; host = the rest of the step)")
    head = f"{'batch':>5} {'ms/step':>8} {'us/seq/step':>11} {'model':>6} {'host':>6}"
    if base:
        head += f" | {'base ms/step':>12} {'base us/seq':>11} {'model':>6} {'host':>6} {'speed-up':>8} {'host x':>7}"
    print(head + (f"   (base = {args.baseline_rev})" if base else ""))
    for batch in args.batches:
        ms, model = now["steps"][batch], now["model"][batch]
        line = f"{batch:>5} {ms:>8.2f} {1e3 * ms / batch:>11.1f} {model:>6.2f} {ms - model:>6.2f}"
        if base:
            b, bm = base["steps"][str(batch)], base["model"][str(batch)]
            line += (f" | {b:>12.2f} {1e3 * b / batch:>11.1f} {bm:>6.2f} {b - bm:>6.2f} {b / ms:>7.1f}x "
                     f"{(b - bm) / max(ms - model, 1e-9):>6.1f}x")  # fmt: skip
        print(line)
    if args.batch1_medium:
        line = f"\nbatch-1 decode, demo 'medium' Llama (fp32, 1 thread): {now['batch1_medium_ms']:.2f} ms/token"
        if base:
            line += f"; base {base['batch1_medium_ms']:.2f} ms/token"
        print(line)
        proj = now["projections"]
        mb = proj["weight_mb"]
        print(f"  its projections + lm_head alone ({mb:.0f} MB of weights, one token, in layer order):")
        for key, label in (("torch_ms", "torch F.linear (M=1)"), ("gemv_ms", "the C GEMV (kernels/cpu/gemv.h)"),
                           ("read_ms", "a plain in-order read of the same bytes")):  # fmt: skip
            if proj.get(key) is not None:
                print(f"    {label:40s} {proj[key]:6.2f} ms  {mb / proj[key]:5.1f} GB/s")
        used = proj["gemv_ms"] if proj.get("gemv_ms") is not None else proj["torch_ms"]
        print(f"  the rest of a step: {now['batch1_medium_ms'] - used:.2f} ms (the step minus the projections "
              "as the engine runs them)")  # fmt: skip


if __name__ == "__main__":
    main()
