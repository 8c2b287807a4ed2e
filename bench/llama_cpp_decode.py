"""Decode speed against llama.cpp on the same model, same machine, same run, one thread each, in full
precision and quantized.

    .venv/bin/python bench/llama_cpp_decode.py --build   # first time: fetch + build llama.cpp (~10 min on 2 cores)
    .venv/bin/python bench/llama_cpp_decode.py           # 16-token prompts, 64 generated, batches 1..128
    .venv/bin/python bench/llama_cpp_decode.py --batches 1,32 --gen 32 --repeats 3
    .venv/bin/python bench/llama_cpp_decode.py --formats q8_0,q4_0 --batches 1,32,128 --prompt 128

The model is bench/engine_vs_hf.py's (make_demo_model size "medium": a random 29.4M-parameter
Llama), converted to GGUF F32 with llama.cpp's own convert_hf_to_gguf.py. llama.cpp comes from the
sources vendored in the llama-cpp-python sdist on PyPI (pinned below), built with CMake for this
CPU (GGML_NATIVE) into --work; only `llama-batched-bench` and `llama-quantize` are built.

--formats pairs each of freight's weight formats with llama.cpp's (FORMATS below): f32 with F32; q8_0
with freight's int8 checkpoint (`freight quantize --method int8 --lm-head`: per-channel int8, the
head too) against Q8_0 (int8 in blocks of 32 with an fp16 scale, its output tensor too); q4_0 with
freight's int4 round-to-nearest at group 32 (`--method int4-rtn --group-size 32 --lm-head`) against
Q4_0 quantized with `llama-quantize --pure` (4 bits in blocks of 32, the output tensor too, where
llama.cpp's default would keep it in Q6_K). Both sides multiply quantized weights by activations
quantized to 8 bits. Each table ends with freight's speed against its own f32 from the same run. The convert script identifies a
BPE pre-tokenizer by hashing its output on a test string and does not know the demo tokenizer's
hash; the bench names it "gpt-2" (a byte-level BPE like the demo's). Token ids are random on both
sides, so the tokenizer never runs in the timed part.

Both sides prefill B prompts of --prompt tokens, then decode --gen tokens per sequence. llama.cpp
reports prompt and generation time separately (`llama-batched-bench -t 1 -tb 1`, prompts not
shared, its default f16 KV cache); freight's generation time is the time of a run generating --gen
tokens minus a run generating 1 (the same prompts, prefix caching off), over gen - 1 steps. Both are
wall time with one compute thread, the best of --repeats runs (a shared machine only slows a run).

--clock cpu counts CPU seconds instead, for a machine whose other users take the cores away (wall
time there measures the queue): freight's process time around each run, llama.cpp's through
getrusage of its process, per batch three processes: --gen tokens, 1 token, and a 1-token prompt
with 1 token (the load, its warm-up and KV allocation: the same context size); generation is the
first minus the second over gen - 1 steps, prefill the second minus the third minus one step. Other
processes still share the caches, on both sides alike.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

SDIST = "llama-cpp-python==0.3.36"  # vendors llama.cpp (ggml 0.25.3)


class Format(NamedTuple):
    llama: str  # llama.cpp's file type
    freight: str | None  # freight quantize's method (None: the fp32 checkpoint as it is)
    group: int = 128


FORMATS = {
    "f32": Format("F32", None),
    "q8_0": Format("Q8_0", "int8"),
    "q4_0": Format("Q4_0", "int4-rtn", 32),
}
CONVERT_SHIM = """
import runpy, sys
root = sys.argv[1]
sys.path[:0] = [root, root + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"  # see the module docstring
def no_sentencepiece(self):  # the demo has no tokenizer.model; skip the sentencepiece import
    raise FileNotFoundError("tokenizer.model")
base.TextModel._set_vocab_sentencepiece = no_sentencepiece
sys.argv = [root + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def llama_source(work: Path) -> Path:
    """The vendored llama.cpp tree, fetched (pip download of the sdist) and unpacked once."""
    found = sorted(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
    if found:
        return found[-1]
    # source for llama-cpp-python only (":all:" would build its build tools from source too)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", SDIST.split("==")[0], "--no-deps", SDIST,
                    "-d", str(work)], check=True)  # fmt: skip
    sdist = sorted(work.glob("llama_cpp_python-*.tar.gz"))[-1]
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    return sorted(work.glob("llama_cpp_python-*/vendor/llama.cpp"))[-1]


def build(work: Path) -> Path:
    src = llama_source(work)
    out = work / "build"
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_OPENSSL=OFF"]
    flags += [f"-DLLAMA_BUILD_{x}=OFF" for x in ("TESTS", "EXAMPLES", "SERVER", "APP")]
    subprocess.run(["cmake", "-S", str(src), "-B", str(out), *flags], check=True)
    jobs = str(os.cpu_count() or 1)
    subprocess.run(["cmake", "--build", str(out), "--target", "llama-batched-bench", "llama-quantize", "-j", jobs],
                   check=True)  # fmt: skip
    return bench_binary(work)


def bench_binary(work: Path, name: str = "llama-batched-bench") -> Path:
    exe = work / "build" / "bin" / name
    if not exe.exists():
        raise SystemExit(f"{exe} is missing: run this script with --build first (fetches and builds llama.cpp)")
    return exe


def llama_quantize(work: Path, f32: Path, out: Path, file_type: str) -> None:
    """GGUF F32 -> file_type with llama-quantize --pure (every tensor in that type; see the docstring)."""
    res = subprocess.run([str(bench_binary(work, "llama-quantize")), "--pure", str(f32), str(out), file_type, "1"],
                         capture_output=True, text=True)  # fmt: skip
    if res.returncode:
        raise SystemExit(f"llama-quantize {file_type} failed:\n{res.stderr[-3000:]}")


def freight_checkpoint(model: Path, fmt: Format, out: Path) -> Path:
    """The fp32 checkpoint, or its `freight quantize` copy (the head quantized too)."""
    if fmt.freight is None:
        return model
    from worker.engine.quant.checkpoint import QuantizeSpec, quantize_checkpoint

    quantize_checkpoint(model, out, QuantizeSpec(method=fmt.freight, group_size=fmt.group, lm_head=True))
    return out


def convert(work: Path, model: Path, out: Path) -> None:
    """HF folder -> GGUF F32 with llama.cpp's converter (in a subprocess: it imports its own packages)."""
    src = llama_source(work)
    cmd = [sys.executable, "-c", CONVERT_SHIM, str(src), str(model), "--outtype", "f32", "--outfile", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"llama.cpp's convert_hf_to_gguf.py failed:\n{res.stderr[-3000:]}")


def run_llama(exe: Path, gguf: Path, batches: list[int], prompt: int, gen: int) -> dict[int, tuple[float, float]]:
    """B -> (prefill seconds, generation seconds) from one llama-batched-bench run."""
    ctx = max(batches) * (prompt + gen) + 16
    cmd = [str(exe), "-m", str(gguf), "-t", "1", "-tb", "1", "-c", str(ctx), "-b", "2048", "-ub", "512",
           "-npp", str(prompt), "-ntg", str(gen), "-npl", ",".join(map(str, batches)), "--output-format", "jsonl"]  # fmt: skip
    for _ in range(3):  # see below
        res = subprocess.run(cmd, check=True, capture_output=True, text=True)
        rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
        out = {r["pl"]: (r["t_pp"], r["t_tg"]) for r in rows}
        missing = [b for b in batches if b not in out]
        if not missing:
            return out
    # llama-batched-bench logs through a background thread; some runs here exit 0 having printed
    # nothing at all (its final log lines lost too), about one in four for a Q8_0 file on a loaded
    # machine: the run is repeated, and three such runs end the bench with what it printed
    raise SystemExit(f"llama-batched-bench reported no result for batches {missing}; its output ends:\n"
                     f"{res.stdout[-1500:]}\n{res.stderr[-1500:]}")  # fmt: skip


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_llama_cpu(exe: Path, gguf: Path, batches: list[int], prompt: int, gen: int) -> dict[int, tuple[float, float]]:
    """B -> (prefill CPU seconds, generation CPU seconds over `gen` steps): three processes a batch
    (the module docstring), each's CPU time from getrusage."""
    out = {}
    for b in batches:
        ctx = b * (prompt + gen) + 16
        spent = {}
        for npp, ntg, npl in ((prompt, gen, b), (prompt, 1, b), (1, 1, 1)):
            cmd = [str(exe), "-m", str(gguf), "-t", "1", "-tb", "1", "-c", str(ctx), "-b", "2048", "-ub", "512",
                   "-npp", str(npp), "-ntg", str(ntg), "-npl", str(npl)]  # fmt: skip
            t0 = _child_cpu()
            subprocess.run(cmd, check=True, capture_output=True)
            spent[ntg if npl == b and npp == prompt else 0] = _child_cpu() - t0
        step = (spent[gen] - spent[1]) / (gen - 1)
        out[b] = (spent[1] - spent[0] - step, step * gen)
    return out


def run_freight(model: Path, batches: list[int], prompt: int, gen: int, backend: str,
                clock=time.perf_counter) -> dict[int, tuple[float, float]]:  # fmt: skip
    """B -> (prefill seconds, generation seconds over `gen` steps) of freight's engine, one thread, on
    `clock` (wall or process time)."""
    from worker.engine import Engine, EngineConfig, SamplingParams

    config = EngineConfig(kv_cache_bytes=3 << 29, enable_prefix_caching=False, num_threads=1, backend=backend,
                          max_num_seqs=max(batches), max_num_batched_tokens=max(2048, max(batches)))  # fmt: skip
    engine = Engine.from_pretrained(model, config)
    rng = random.Random(0)
    vocab = engine.vocab_size
    out = {}
    for b in batches:
        prompts = [[rng.randrange(3, vocab) for _ in range(prompt)] for _ in range(b)]
        timed = {}
        for n in (1, gen):
            t0 = clock()
            engine.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True))
            timed[n] = clock() - t0
        # a run of `gen` tokens = prefill (+ its first token) + gen - 1 decode steps
        out[b] = (timed[1], (timed[gen] - timed[1]) * gen / (gen - 1))
    return out


def best(runs: list[dict[int, tuple[float, float]]]) -> dict[int, tuple[float, float]]:
    return {b: (min(r[b][0] for r in runs), min(r[b][1] for r in runs)) for b in runs[0]}


def print_table(name: str, fmt: Format, batches: list[int], prompt: int, gen: int, lc: dict, fr: dict,
                fr_f32: dict | None) -> None:  # fmt: skip
    """One format's rows: per batch, decode ms per step and total tokens/s (prefill + generation) on
    both sides, their ratios, and freight's prefill, decode and total speed against its own f32 of
    the same run."""
    print(f"\n{name}: freight {fmt.freight or 'fp32'}{f' g{fmt.group}' if fmt.freight == 'int4-rtn' else ''}"
          f" against llama.cpp {fmt.llama}")  # fmt: skip
    head = f"{'batch':>5} {'llama.cpp ms/step':>18} {'freight ms/step':>16} {'decode ratio':>13} " \
           f"{'llama.cpp tok/s':>16} {'freight tok/s':>14} {'total ratio':>12}"  # fmt: skip
    print(head + (f" {'prefill vs f32':>15} {'decode vs f32':>14} {'total vs f32':>13}" if fr_f32 is not None else ""))
    for b in batches:
        l_ms, f_ms = lc[b][1] / gen * 1e3, fr[b][1] / gen * 1e3
        l_tps, f_tps = b * (prompt + gen) / sum(lc[b]), b * (prompt + gen) / sum(fr[b])
        line = f"{b:>5} {l_ms:>18.2f} {f_ms:>16.2f} {l_ms / f_ms:>12.2f}x {l_tps:>16,.0f} {f_tps:>14,.0f} {f_tps / l_tps:>11.2f}x"
        if fr_f32 is not None:
            line += f" {fr_f32[b][0] / fr[b][0]:>14.2f}x {fr_f32[b][1] / fr[b][1]:>13.2f}x {sum(fr_f32[b]) / sum(fr[b]):>12.2f}x"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("bench/results/llama.cpp"),
                    help="where llama.cpp is fetched and built (default bench/results/llama.cpp, git-ignored)")  # fmt: skip
    ap.add_argument("--build", action="store_true", help="fetch and build llama.cpp first")
    ap.add_argument("--batches", default="1,16,32,64,128", help="sequences per batch, comma-separated")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens per sequence")
    ap.add_argument("--gen", type=int, default=64, help="generated tokens per sequence")
    ap.add_argument("--repeats", type=int, default=2, help="runs per side, alternating; the fastest is kept")
    ap.add_argument("--backend", default="auto", help="freight's backend (auto, cpu, torch)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall time, or CPU time on a machine other users load (the module docstring)")  # fmt: skip
    ap.add_argument("--formats", default="f32,q8_0,q4_0",
                    help=f"weight formats, comma-separated, among {', '.join(FORMATS)} (f32 always runs: the baseline)")  # fmt: skip
    args = ap.parse_args()
    if args.gen < 2:
        ap.error("--gen must be at least 2")
    batches = [int(b) for b in args.batches.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    if args.build and shutil.which("cmake") is None:
        raise SystemExit("cmake is not installed: apt-get install cmake")
    exe = build(args.work) if args.build else bench_binary(args.work)

    formats = args.formats.split(",")
    unknown = set(formats) - set(FORMATS)
    if unknown:
        ap.error(f"--formats: unknown {sorted(unknown)}; choose among {sorted(FORMATS)}")
    if "f32" not in formats:
        formats = ["f32", *formats]  # the quantized rows' own baseline
    import torch

    from worker.demo_model import make_demo_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = make_demo_model(Path(tmp) / "llama", "llama", size="medium")
        f32 = Path(tmp) / "model-f32.gguf"
        convert(args.work, model, f32)
        ggufs, checkpoints = {}, {}
        for name in formats:
            fmt = FORMATS[name]
            ggufs[name] = f32 if fmt.llama == "F32" else Path(tmp) / f"model-{name}.gguf"
            if fmt.llama != "F32":
                llama_quantize(args.work, f32, ggufs[name], fmt.llama)
            checkpoints[name] = freight_checkpoint(model, fmt, Path(tmp) / f"freight-{name}")
        llama_runs: dict[str, list] = {name: [] for name in formats}
        freight_runs: dict[str, list] = {name: [] for name in formats}
        for _ in range(args.repeats):  # alternating: each round runs every format on both sides
            for name in formats:
                if args.clock == "cpu":
                    llama_runs[name].append(run_llama_cpu(exe, ggufs[name], batches, args.prompt, args.gen))
                else:
                    llama_runs[name].append(run_llama(exe, ggufs[name], batches, args.prompt, args.gen))
                clock = time.process_time if args.clock == "cpu" else time.perf_counter
                freight_runs[name].append(run_freight(checkpoints[name], batches, args.prompt, args.gen, args.backend,
                                                      clock))  # fmt: skip
    print(f"model: make_demo_model size=medium (29.4M params); {args.prompt}-token prompts, {args.gen} generated; "
          f"one thread each; {args.clock} time, best of {args.repeats}, the rounds alternating")  # fmt: skip
    base = best(freight_runs["f32"])
    for name in formats:
        print_table(name, FORMATS[name], batches, args.prompt, args.gen, best(llama_runs[name]), best(freight_runs[name]),
                    None if name == "f32" else base)  # fmt: skip
    print("\ndecode ratio = llama.cpp time per decode step / freight's; total ratio = freight's tokens/s / llama.cpp's "
          "(prompt + generated tokens over prefill + generation time); > 1: freight is faster")  # fmt: skip


if __name__ == "__main__":
    main()
