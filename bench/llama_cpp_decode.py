"""Decode speed against llama.cpp on the same model, same machine, same run, one thread each.

    .venv/bin/python bench/llama_cpp_decode.py --build   # first time: fetch + build llama.cpp (~10 min on 2 cores)
    .venv/bin/python bench/llama_cpp_decode.py           # 16-token prompts, 64 generated, batches 1..128
    .venv/bin/python bench/llama_cpp_decode.py --batches 1,32 --gen 32 --repeats 3

The model is bench/engine_vs_hf.py's (make_demo_model size "medium": a random 29.4M-parameter
Llama), converted to GGUF F32 with llama.cpp's own convert_hf_to_gguf.py. llama.cpp comes from the
sources vendored in the llama-cpp-python sdist on PyPI (pinned below), built with CMake for this
CPU (GGML_NATIVE) into --work; only `llama-batched-bench` is built. The convert script identifies a
BPE pre-tokenizer by hashing its output on a test string and does not know the demo tokenizer's
hash; the bench names it "gpt-2" (a byte-level BPE like the demo's). Token ids are random on both
sides, so the tokenizer never runs in the timed part.

Both sides prefill B prompts of --prompt tokens, then decode --gen tokens per sequence. llama.cpp
reports prompt and generation time separately (`llama-batched-bench -t 1 -tb 1`, prompts not
shared, its default f16 KV cache); freight's generation time is the time of a run generating --gen
tokens minus a run generating 1 (the same prompts, prefix caching off), over gen - 1 steps. Both are
wall time with one compute thread, the best of --repeats runs (a shared machine only slows a run).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

SDIST = "llama-cpp-python==0.3.36"  # vendors llama.cpp (ggml 0.25.3)
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
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", SDIST,
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
    subprocess.run(["cmake", "--build", str(out), "--target", "llama-batched-bench", "-j", jobs], check=True)
    return bench_binary(work)


def bench_binary(work: Path) -> Path:
    exe = work / "build" / "bin" / "llama-batched-bench"
    if not exe.exists():
        raise SystemExit(f"{exe} is missing: run this script with --build first (fetches and builds llama.cpp)")
    return exe


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
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    out = {r["pl"]: (r["t_pp"], r["t_tg"]) for r in rows}
    missing = [b for b in batches if b not in out]
    if missing:  # seen once, not reproduced: say what llama.cpp printed instead of a KeyError later
        raise SystemExit(f"llama-batched-bench reported no result for batches {missing}; its output ends:\n"
                         f"{res.stdout[-1500:]}\n{res.stderr[-1500:]}")  # fmt: skip
    return out


def run_freight(model: Path, batches: list[int], prompt: int, gen: int, backend: str) -> dict[int, tuple[float, float]]:
    """B -> (prefill seconds, generation seconds over `gen` steps) of freight's engine, one thread."""
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
            t0 = time.perf_counter()
            engine.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True))
            timed[n] = time.perf_counter() - t0
        # a run of `gen` tokens = prefill (+ its first token) + gen - 1 decode steps
        out[b] = (timed[1], (timed[gen] - timed[1]) * gen / (gen - 1))
    return out


def best(runs: list[dict[int, tuple[float, float]]]) -> dict[int, tuple[float, float]]:
    return {b: (min(r[b][0] for r in runs), min(r[b][1] for r in runs)) for b in runs[0]}


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
    args = ap.parse_args()
    if args.gen < 2:
        ap.error("--gen must be at least 2")
    batches = [int(b) for b in args.batches.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    if args.build and shutil.which("cmake") is None:
        raise SystemExit("cmake is not installed: apt-get install cmake")
    exe = build(args.work) if args.build else bench_binary(args.work)

    import torch

    from worker.demo_model import make_demo_model

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = make_demo_model(Path(tmp) / "llama", "llama", size="medium")
        gguf = Path(tmp) / "model-f32.gguf"
        convert(args.work, model, gguf)
        llama_runs, freight_runs = [], []
        for _ in range(args.repeats):
            llama_runs.append(run_llama(exe, gguf, batches, args.prompt, args.gen))
            freight_runs.append(run_freight(model, batches, args.prompt, args.gen, args.backend))
    lc, fr = best(llama_runs), best(freight_runs)
    print(f"model: make_demo_model size=medium (29.4M params), GGUF F32 for llama.cpp; {args.prompt}-token "
          f"prompts, {args.gen} generated; one thread each; best of {args.repeats}")  # fmt: skip
    print(f"\n{'batch':>5} {'llama.cpp ms/step':>18} {'freight ms/step':>16} {'decode ratio':>13} "
          f"{'llama.cpp prefill s':>20} {'freight prefill s':>18}")  # fmt: skip
    for b in batches:
        l_ms, f_ms = lc[b][1] / args.gen * 1e3, fr[b][1] / args.gen * 1e3
        print(f"{b:>5} {l_ms:>18.2f} {f_ms:>16.2f} {l_ms / f_ms:>12.2f}x {lc[b][0]:>20.3f} {fr[b][0]:>18.3f}")
    print("\ndecode ratio = llama.cpp time per decode step / freight's (> 1: freight is faster)")


if __name__ == "__main__":
    main()
