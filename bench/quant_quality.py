"""Quantization quality and CPU decode speed of freight's engine, on the trained reference model.

Perplexity: the reference model (bench/train_reference.py, examples/models/pycoder-tiny) on the first
--windows windows of --window tokens of its held-out stdlib files (train_reference.heldout_files),
scored through the engine's prompt_logprobs: fp32, int8 (on the CPU's integer kernels, activations
rounded to int8 per block; and its weights' exact product), int4 RTN and int4 GPTQ at group 128 and
32, int8 and GPTQ g32 with the lm_head quantized too, and fp8 (e4m3 weights per output channel, activations rounded to e4m3 per token; on the CPU through
the exact torch reference, so the figure is the GPU format's).
GPTQ calibrates on --calibration-rows chunks of the *training* files, written to a Parquet file and
read back the way `freight quantize --calibration` reads it.
Weight bytes: the decoder Linear weights of each checkpoint (scales included) against their bf16 size.
Speed: CPU decode tokens/s at batch 1, 8, 32 (short prompts, --decode-tokens new tokens each, greedy,
ignore_eos), fp32 vs on-the-fly int8 vs int4 vs fp8, on the reference model and on a bigger random
model (--big-hidden) where the weights, not the per-step overhead, dominate.

    .venv/bin/python bench/quant_quality.py                  # everything, prints the tables
    .venv/bin/python bench/quant_quality.py --speed none     # perplexity and bytes only (speed: quant_speed.py)
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_reference  # noqa: E402  (the held-out split's definition)
from quant_speed import big_random_model, cpu_engine, decode_speed, matmul_speed  # noqa: E402

from worker.engine import Engine, SamplingParams  # noqa: E402
from worker.engine.quant.calibration import read_calibration_texts  # noqa: E402
from worker.engine.quant.checkpoint import QuantizeSpec, quantize_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def heldout_windows(engine: Engine, n: int, length: int) -> list[list[int]]:
    """The first n non-overlapping windows of the held-out files' token stream (EOS between files)."""
    eos = min(engine.tokenizer.eos_token_ids)
    stream: list[int] = []
    for _, text in train_reference.heldout_files():
        stream += engine.tokenizer.encode(text) + [eos]
        if len(stream) >= n * length:
            break
    if len(stream) < n * length:
        raise SystemExit(f"held-out split has only {len(stream)} tokens; lower --windows")
    return [stream[i * length : (i + 1) * length] for i in range(n)]


def perplexity(engine: Engine, windows: list[list[int]]) -> float:
    outs = engine.generate(windows, SamplingParams(max_tokens=1, prompt_logprobs=True))
    lps = [lp for out in outs for lp in out.prompt_logprobs[1:]]
    return math.exp(-sum(lps) / len(lps))


def linear_bytes(model_dir: Path) -> int:
    """Bytes of the decoder Linear weights (weight, or qweight + scales), lm_head and embeddings excluded."""
    total = 0
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        for name in f.keys():  # noqa: SIM118
            if (
                name.startswith("model.layers.")
                and name.rsplit(".", 1)[1] in ("weight", "qweight", "scales")
                and "_proj." in name
            ):
                t = f.get_tensor(name)
                total += t.numel() * t.element_size()
    return total


def linear_params(model_dir: Path) -> int:
    """Parameters of the decoder Linear weights of a full-precision checkpoint."""
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        return sum(
            f.get_slice(n).get_shape()[0] * f.get_slice(n).get_shape()[1]
            for n in f.keys()  # noqa: SIM118
            if n.startswith("model.layers.") and n.endswith("_proj.weight")
        )


def calibration_parquet(path: Path, rows: int, tokens: int) -> None:
    """`rows` chunks of about `tokens` tokens (4 characters each) of the training files, column prompt."""
    chunks: list[str] = []
    for text in train_reference.train_files():
        for i in range(0, len(text) - tokens * 4, tokens * 4 * 8):  # spread over each file
            chunks.append(text[i : i + tokens * 4])
    step = max(1, len(chunks) // rows)
    pq.write_table(pa.table({"prompt": chunks[::step][:rows]}), path)


def quantize(model: Path, out: Path, method: str, group: int, calib: Path | None, lm_head: bool = False) -> float:
    """What `freight quantize MODEL --method ... --calibration calib [--lm-head]` does, in this process."""
    texts = read_calibration_texts(calib, "prompt", 1 << 20) if calib is not None else None
    t0 = time.perf_counter()
    quantize_checkpoint(model, out, QuantizeSpec(method=method, group_size=group, lm_head=lm_head), texts)
    return time.perf_counter() - t0


def quality(args: argparse.Namespace) -> None:
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    calib = work / "calibration.parquet"
    calibration_parquet(calib, args.calibration_rows, args.window)
    variants: list[tuple[str, Path, float]] = [("fp32 (fp16 checkpoint)", args.model, 0.0)]
    int8_exact = ("int8, exact fp32 path", work / "int8", 0.0)  # same checkpoint, cpu_path "weight_only"
    for name, method, group in (
        ("int8", "int8", 128),
        ("int8 + lm_head", "int8", 128),
        ("int4-rtn g128", "int4-rtn", 128),
        ("int4-gptq g128", "int4-gptq", 128),
        ("int4-rtn g32", "int4-rtn", 32),
        ("int4-gptq g32", "int4-gptq", 32),
        ("int4-gptq g32 + lm_head", "int4-gptq", 32),
        ("fp8 e4m3", "fp8", 128),
    ):
        out = work / name.replace(" ", "-").replace("+", "with")
        secs = quantize(args.model, out, method, group, calib if "gptq" in method else None, "lm_head" in name)
        variants.append((name, out, secs))
        if name == "int8":
            variants.append(int8_exact)
    bf16 = 2 * linear_params(args.model)
    base = None
    print(
        f"\nheld-out perplexity: {args.windows} windows x {args.window} tokens; GPTQ calibration "
        f"{args.calibration_rows} x ~{args.window} training tokens"
    )
    print(f"{'variant':24} {'ppl':>8} {'vs fp32':>8} {'Linear bytes':>13} {'vs bf16':>8} {'quantize s':>10}")
    rows = []
    for name, path, secs in variants:
        engine = cpu_engine(path)
        for module in engine.runner.model.modules():
            if hasattr(module, "cpu_path"):  # the CPU path: the integer kernels, or the weights' exact product
                module.cpu_path = "weight_only" if "exact" in name else "kernel"
        windows = heldout_windows(engine, args.windows, args.window)
        ppl = perplexity(engine, windows)
        base = base or ppl
        nbytes = linear_bytes(path)
        rows.append({"variant": name, "ppl": ppl, "bytes": nbytes, "quantize_s": secs})
        print(
            f"{name:24} {ppl:8.3f} {ppl / base - 1:+8.2%} {nbytes:13,d} {nbytes / bf16:8.1%} {secs:10.1f}",
            flush=True,
        )
    (work / "quality.json").write_text(json.dumps(rows, indent=2))


def layer_errors(args: argparse.Namespace) -> None:
    """Relative output error of every decoder Linear on held-out activations, RTN vs GPTQ.

    GPTQ's Hessians come from the training-split calibration rows, the error is measured on the
    held-out windows' activations: tr(D H D^T) / tr(W H W^T) with D = W - dequant(Q).
    """
    from worker.engine.quant.calibration import SequentialHessians
    from worker.engine.quant.formats import dequantize_int4, quantize_int4
    from worker.engine.quant.gptq import GPTQConfig, gptq_quantize_int4

    engine = cpu_engine(args.model)
    calib = [engine.tokenizer.encode(t)[: args.window] for t in read_calibration_texts(
        args.workdir / "calibration.parquet", "prompt", 1 << 20)]
    held = heldout_windows(engine, 8, args.window)
    layers = engine.runner.model.model.layers
    run = lambda p: engine.generate(p, SamplingParams(max_tokens=1))  # noqa: E731
    cal_h = {(i, n): a.hessian for i, accs in SequentialHessians(layers, run, calib).layers() for n, a in accs.items()}
    eval_h = {(i, n): a.hessian.float() for i, accs in SequentialHessians(layers, run, held).layers()
              for n, a in accs.items()}
    print("\nrelative output error of the decoder Linears on held-out activations (mean over "
          f"{len(eval_h)} modules; GPTQ Hessians from {len(calib)} training rows)")
    print(f"{'group':>5} {'RTN':>9} {'GPTQ':>9} {'GPTQ act-order':>15}")
    for g in (128, 32):
        errs: dict[str, list[float]] = {"rtn": [], "gptq": [], "act": []}
        for (i, name), h in eval_h.items():
            w = layers[i].get_submodule(name).weight.detach().float()

            def rel(deq: torch.Tensor, h: torch.Tensor = h, w: torch.Tensor = w) -> float:
                d = w - deq
                return float(torch.einsum("nk,kl,nl->", d, h, d) / torch.einsum("nk,kl,nl->", w, h, w))

            errs["rtn"].append(rel(dequantize_int4(*quantize_int4(w, g), g)))
            for key, act in (("gptq", False), ("act", True)):
                q, sc = gptq_quantize_int4(w, cal_h[(i, name)], GPTQConfig(group_size=g, act_order=act))
                errs[key].append(rel(q.float() * sc.repeat_interleave(g, dim=1)))
        mean = {k: sum(v) / len(v) for k, v in errs.items()}
        print(f"{g:5d} {mean['rtn']:9.5f} {mean['gptq']:9.5f} {mean['act']:15.5f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=ROOT / "examples/models/pycoder-tiny")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/freight-quant-bench"))
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--calibration-rows", type=int, default=32)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--big-hidden", type=int, default=2048)
    ap.add_argument("--big-layers", type=int, default=2)
    # 1: on a shared 2-core machine, 2 torch threads spin-wait on each other (`--threads 2` shows it on
    # the small Linears), which hides what the weights cost.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument(
        "--speed",
        choices=("both", "reference", "big", "none"),
        default="both",
        help="which models' decode speed to measure",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not args.skip_quality:
        quality(args)
        layer_errors(args)
    batches = (1, 8, 32)
    if args.speed != "none":
        matmul_speed(((768, 256), (4096, 4096), (11264, 4096)), batches)
    if args.speed in ("both", "reference"):
        decode_speed(args.model, f"reference model {args.model.name}", args.decode_tokens, batches)
    if args.speed in ("both", "big"):
        big = big_random_model(args.model, args.workdir / "big-random", args.big_hidden, args.big_layers)
        decode_speed(
            big,
            f"random Llama hidden {args.big_hidden} x {args.big_layers} layers",
            args.decode_tokens,
            batches,
        )


if __name__ == "__main__":
    main()
