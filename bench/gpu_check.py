"""GPU check of freight's Triton kernels: correctness at real sizes, speed against the device's own
ceilings, and the engine end to end. One run, under 5 minutes on one H100/H200.

    .venv/bin/python bench/gpu_check.py gpu_check.json            # on a GPU
    .venv/bin/python bench/gpu_check.py /tmp/dry.json --dry-run   # CPU, Triton interpreter, tiny sizes

Sections, each failing soft (an error is recorded and the next section runs):
  (a) ceilings: device-to-device copy GB/s (read + write) and bf16 torch.matmul TFLOP/s;
  (b) every kernel against its torch reference (bf16; relative Frobenius error within a bound);
  (c) each kernel timed with triton.testing.do_bench (median), achieved GB/s or TFLOP/s against the
      ceilings of (a), and the targets: paged decode >= 70% of copy bandwidth (batch 64, 4k context),
      prefill >= 50% of matmul peak at 4k; the quantized matmuls (bench/gpu_check_matmul.py) as
      replayed CUDA graphs (kernels alone): int4 and int8 at M 1..16 >= 1.5x the bf16 torch matmul
      (GEMV and tensor-core kernels each timed, with the weight-read roofline), fp8 at M 4096 >= 1.6x;
  (c) the fused-MoE kernel against a loop of per-expert torch matmuls at Qwen3-30B-A3B,
      Mixtral-8x7B and gpt-oss-20b shapes (gpt-oss: expert biases, clamped SwiGLU; bench/gpu_check_moe.py);
  (c') a few launch configs around those three kernels' defaults (bench/gpu_check_sweep.py);
  (d) the engine on a random ~1B-parameter Llama (bf16), a mixed batch, tokens/s (bench/gpu_check_engine.py);
  (e) exactness on the device: every architecture's greedy tokens against transformers on the same
      GPU, CUDA-graph decode against eager, overlapped against serial steps (bench/gpu_check_exactness.py);
  (f) everything into the JSON file named on the command line.
On a GPU machine the whole check is one command, bench/gpu_run.sh (its header says how).
--dry-run sets TRITON_INTERPRET=1 before triton is imported and runs every section on tiny CPU
shapes with a wall-clock timer: it checks the plumbing; its speed figures mean nothing.
Exit status 1 when a section failed or a kernel missed its error bound (a missed speed target is
reported, not an error).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import traceback
from pathlib import Path

# Relative error bounds by kind of op, for bf16 inputs against fp32-computing references.
BOUNDS = {"exact": 0.0, "elementwise": 1e-2, "reduction": 2e-2}


class Check:
    """Collects results; `section` runs one part and records an error instead of raising."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.report: dict = {
            "mode": "interpret" if dry_run else "gpu",
            "ceilings": {},
            "kernels": [],
            "targets": [],
            "engine": {},
            "errors": [],
        }

    def section(self, name: str, fn, *args) -> None:
        start = time.perf_counter()
        print(f"\n== {name}", flush=True)
        try:
            fn(self, *args)
        except Exception as exc:  # fail soft: record, go on with the next section
            self.report["errors"].append(
                {"section": name, "error": repr(exc), "traceback": traceback.format_exc(limit=6)}
            )
            print(f"   FAILED: {exc!r}", flush=True)
        print(f"   ({time.perf_counter() - start:.1f} s)", flush=True)

    def case(self, name: str, fn, *args) -> None:
        """One kernel at one shape inside a section: a failure is recorded and the section goes on."""
        try:
            fn(*args)
        except Exception as exc:  # fail soft: one broken kernel does not hide the others
            self.report["errors"].append(
                {"section": name, "error": repr(exc), "traceback": traceback.format_exc(limit=6)}
            )
            print(f"   {name}: FAILED {exc!r}", flush=True)

    def time_graph_ms(self, fn) -> float:
        """Median milliseconds of fn() captured in a CUDA graph and replayed: the GPU work without
        the Python launch cost (wall-clock runs in the interpreter)."""
        if self.dry_run:
            return self.time_ms(fn)
        import triton.testing

        return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")

    def time_ms(self, fn) -> float:
        """Median milliseconds of fn(): do_bench on a GPU; in the interpreter, one wall-clock run (its
        figure means nothing, and each run of a kernel there takes a while)."""
        if self.dry_run:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    def kernel(
        self,
        name: str,
        shape: str,
        got,
        want,
        bound: str,
        ms: float,
        amount: float,
        unit: str,
        ceiling: str | None,
        extra: dict | None = None,
    ) -> dict:
        """Record one kernel row: error vs reference, time, achieved GB/s or TFLOP/s (`amount` is
        bytes or FLOPs per call) and the fraction of the matching ceiling."""
        import torch

        diff = (got.float() - want.float()).norm()
        rel = float(diff / want.float().norm().clamp_min(1e-30))
        finite = bool(torch.isfinite(got.float()).all())
        ok = finite and rel <= BOUNDS[bound]
        rate = amount / (ms * 1e-3) / (1e9 if unit == "GB/s" else 1e12)
        ceil = self.report["ceilings"].get(ceiling) if ceiling else None
        row = {
            "name": name,
            "shape": shape,
            "rel_err": rel,
            "bound": BOUNDS[bound],
            "ok": ok,
            "median_ms": ms,
            "achieved": rate,
            "unit": unit,
            "of_ceiling": rate / ceil if ceil else None,
            **(extra or {}),
        }
        self.report["kernels"].append(row)
        frac = f"{row['of_ceiling']:6.1%}" if ceil else "     -"
        print(
            f"   {name:<22} {shape:<34} err {rel:8.1e} {'ok ' if ok else 'BAD'} "
            f"{ms * 1e3:10.1f} us {rate:9.1f} {unit:<7} {frac}",
            flush=True,
        )
        return row

    def target(self, name: str, value: float | None, goal: float, what: str) -> None:
        met = value is not None and value >= goal
        self.report["targets"].append({"name": name, "value": value, "goal": goal, "met": met, "what": what})


def ceilings(chk: Check, device) -> None:
    """(a) D2D copy bandwidth (bytes read + written) and bf16 matmul throughput."""
    import torch

    n_bytes = (1 << 20) if chk.dry_run else (1 << 30)
    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = chk.time_ms(lambda: dst.copy_(src))
    chk.report["ceilings"]["copy_gbps"] = 2 * n_bytes / (ms * 1e-3) / 1e9
    n = 256 if chk.dry_run else 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    ms = chk.time_ms(lambda: a @ b)
    chk.report["ceilings"]["matmul_tflops"] = 2 * n**3 / (ms * 1e-3) / 1e12
    print(
        f"   copy {chk.report['ceilings']['copy_gbps']:.0f} GB/s, "
        f"bf16 matmul {chk.report['ceilings']['matmul_tflops']:.1f} TFLOP/s",
        flush=True,
    )


def _main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("output", type=Path, help="JSON file to write the results to")
    parser.add_argument(
        "--dry-run",
        "--interpret",
        dest="dry_run",
        action="store_true",
        help="CPU + Triton interpreter, tiny sizes: checks the script, not the GPU",
    )
    parser.add_argument("--skip-engine", action="store_true", help="leave out section (d)")
    parser.add_argument("--skip-sweep", action="store_true", help="leave out the launch-config sweep")
    parser.add_argument("--skip-kernels", action="store_true", help="leave out sections (a) to (c)")
    parser.add_argument("--skip-exactness", action="store_true", help="leave out section (e)")
    args = parser.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # read by triton when the kernels are decorated (import)
    import torch

    # imported after TRITON_INTERPRET is settled
    from gpu_check_kernels import attention_kernels, small_kernels
    from gpu_check_lora import lora_kernels
    from gpu_check_matmul import fp8_kernels, matmul_kernels
    from gpu_check_moe import moe_kernels
    from gpu_check_sweep import sweeps

    chk = Check(args.dry_run)
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --dry-run to check the script on the CPU")
    device = torch.device("cpu" if args.dry_run else "cuda")
    chk.report["device"] = "cpu (interpreter)" if args.dry_run else torch.cuda.get_device_name(device)
    chk.report["versions"] = {"torch": torch.__version__, "python": platform.python_version()}
    started = time.perf_counter()
    if not args.skip_exactness:  # first: a wrong token matters more than a slow one
        from gpu_check_exactness import exactness

        chk.section("(e) exactness on the device", exactness, device)
    if not args.skip_kernels:
        chk.section("(a) ceilings", ceilings, device)
        chk.section("(b, c) attention kernels", attention_kernels, device)
        chk.section("(b, c) quantized matmuls", matmul_kernels, device)
        chk.section("(b, c) fp8 matmul", fp8_kernels, device)
        chk.section("(b, c) small kernels", small_kernels, device)
        chk.section("(b, c) fused MoE", moe_kernels, device)
        chk.section("(b, c) LoRA", lora_kernels, device)
    if not args.skip_sweep:
        chk.section("(c') launch-config sweep", sweeps, device)
    if not args.skip_engine:
        from gpu_check_engine import engine_end_to_end

        chk.section("(d) engine end to end", engine_end_to_end, device)
    chk.report["wall_seconds"] = time.perf_counter() - started

    print("\n== targets")
    for t in chk.report["targets"]:
        value = "n/a" if t["value"] is None else f"{t['value']:.2f}"
        print(f"   {'MET ' if t['met'] else 'MISS'} {t['name']:<40} {value} (goal {t['goal']}: {t['what']})")
    bad = [k["name"] for k in chk.report["kernels"] if not k["ok"]]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(chk.report, indent=2) + "\n", encoding="utf-8")
    print(
        f"\nwrote {args.output}; {len(chk.report['errors'])} section errors, {len(bad)} kernels off "
        f"their error bound {bad if bad else ''}; {chk.report['wall_seconds']:.0f} s"
    )
    return 1 if bad or chk.report["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(_main())
