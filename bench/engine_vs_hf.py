"""freight's engine vs transformers `generate` on one random ~30M-parameter Llama, same machine, same run.

    .venv/bin/python bench/engine_vs_hf.py            # 256 + 256 prompts (several minutes on 2 cores)
    .venv/bin/python bench/engine_vs_hf.py --quick    # 64 + 64 prompts
    .venv/bin/python bench/engine_vs_hf.py --skip-hf --backend torch   # freight alone, one backend
    .venv/bin/python bench/engine_vs_hf.py --dtype bfloat16            # both sides in bf16
    .venv/bin/python bench/engine_vs_hf.py --threads 1 --repeats 2     # best of two alternating runs per side

Workloads (random token ids, EOS ignored so both sides generate exactly max_tokens per prompt):
  mixed          prompts of 16..512 tokens, max_tokens 16..128
  shared prefix  one 1,000-token prefix + a distinct 32-token suffix per prompt, max_tokens 16
transformers gets its best shot: prompts sorted by length, left-padded batches, greedy, KV cache on;
each batch generates the batch's largest max_tokens and only each prompt's own max_tokens count.
Throughput counts prompt + completion tokens of the requests (the same for both sides). The CPU-time
ratio is the fair one on a machine shared with other work when run with --threads 1.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from worker.demo_model import make_demo_model
from worker.engine import Engine, EngineConfig, SamplingParams


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: list[list[int]]
    max_tokens: list[int]

    @property
    def tokens(self) -> int:
        return sum(len(p) for p in self.prompts) + sum(self.max_tokens)


def workloads(n: int, vocab: int, seed: int = 0) -> list[Workload]:
    rng = random.Random(seed)

    def rand(k: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(k)]

    mixed = Workload(
        "mixed", [rand(rng.randint(16, 512)) for _ in range(n)], [rng.randint(16, 128) for _ in range(n)]
    )
    prefix = rand(1000)
    shared = Workload("shared prefix", [prefix + rand(32) for _ in range(n)], [16] * n)
    return [mixed, shared]


@dataclass(frozen=True)
class Timing:
    wall: float  # seconds
    cpu: float  # process CPU seconds: with --threads 1, the work done, whatever else runs here

    @classmethod
    def since(cls, wall0: float, cpu0: float) -> Timing:
        return cls(time.perf_counter() - wall0, time.process_time() - cpu0)


def run_engine(engine: Engine, w: Workload) -> tuple[Timing, dict]:
    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in w.max_tokens]
    before = engine.stats.snapshot()
    t0, c0 = time.perf_counter(), time.process_time()
    outs = engine.generate(w.prompts, params)
    elapsed = Timing.since(t0, c0)
    if any(len(o.token_ids) != m for o, m in zip(outs, w.max_tokens, strict=True)):
        raise RuntimeError("engine produced the wrong number of tokens")
    delta = engine.stats.snapshot() - before
    return elapsed, {"computed": delta.computed_prefill_tokens, "prompt": delta.prompt_tokens}


@torch.inference_mode()
def run_hf(model: torch.nn.Module, w: Workload, batch_size: int) -> Timing:
    order = sorted(range(len(w.prompts)), key=lambda i: len(w.prompts[i]))
    t0, c0 = time.perf_counter(), time.process_time()
    for lo in range(0, len(order), batch_size):
        idx = order[lo : lo + batch_size]
        width = max(len(w.prompts[i]) for i in idx)
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        mask = torch.zeros(len(idx), width, dtype=torch.long)
        for row, i in enumerate(idx):
            p = w.prompts[i]
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        new = max(w.max_tokens[i] for i in idx)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, pad_token_id=0)  # fmt: skip
        if out.shape[1] != width + new:
            raise RuntimeError("transformers stopped early")
    return Timing.since(t0, c0)


def matmul_gflops(hidden: int, ffn: int, dtype: torch.dtype, m: int = 256, seconds: float = 2.0) -> float:
    """Measured rate of this machine on the model's own projection shape (gate_up, M rows)."""
    x, w = torch.randn(m, hidden, dtype=dtype), torch.randn(2 * ffn, hidden, dtype=dtype)
    for _ in range(3):
        x @ w.T
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x @ w.T
        n += 1
    return 2 * m * hidden * 2 * ffn * n / (time.perf_counter() - t0) / 1e9


def read_gbps(mib: int = 512, seconds: float = 2.0) -> float:
    """Measured streaming read rate of this machine (GB/s): a sum over a buffer far larger than cache."""
    x = torch.ones(mib << 18)  # fp32
    x.sum()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x.sum()
        n += 1
    return x.numel() * 4 * n / (time.perf_counter() - t0) / 1e9


def decode_kv_bytes(w: Workload, cfg, bytes_per: int) -> int:
    """K and V bytes decode attention must read: each generated token after the first (which the
    prefill yields) attends its whole context once per layer."""
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    contexts = sum((m - 1) * len(p) + m * (m - 1) // 2 for p, m in zip(w.prompts, w.max_tokens, strict=True))
    return contexts * per_token * bytes_per


def print_bounds(rows: list, hf: torch.nn.Module, rate: float, dtype: str, gbps: float) -> None:
    """How far any engine in this dtype could go: the matmul work freight itself must do at the measured rate,
    plus (where no prefix is shared) decode attention's K/V reads at the measured streaming read rate.

    A computed prompt token runs every layer but the last, plus the last layer's qkv (its K/V are
    needed later); a generated token runs every layer and the lm_head. Everything else is left out,
    so the bound is generous. A shared prefix's K/V are read once per step (cascade), not per
    sequence, so that workload's bound counts the matmuls only.
    """
    layer = hf.model.layers[0]
    per_layer = sum(p.numel() for p in layer.parameters() if p.dim() == 2)
    qkv = sum(getattr(layer.self_attn, n).weight.numel() for n in ("q_proj", "k_proj", "v_proj"))
    n_layers, head = len(hf.model.layers), hf.lm_head.weight.numel()
    bytes_per = torch.finfo(getattr(torch, dtype)).bits // 8
    print(f"\n{dtype} floor at the measured {rate:.1f} GFLOP/s matmul and {gbps:.1f} GB/s streaming read:")
    for w, te, th, c in rows:
        generated = sum(w.max_tokens)
        flops = 2 * c["computed"] * ((n_layers - 1) * per_layer + qkv)
        flops += 2 * generated * (n_layers * per_layer + head)
        floor = flops / (rate * 1e9)
        kv = 0 if c["computed"] < c["prompt"] else decode_kv_bytes(w, hf.config, bytes_per)
        kv_s = kv / (gbps * 1e9)
        print(f"  {w.name:<14} matmul {floor:6.1f} s + K/V reads {kv / 1e9:5.1f} GB {kv_s:5.1f} s; freight "
              f"{te.cpu:6.1f} CPU s ({floor / te.cpu:.0%} of it matmul); transformers {th.cpu:6.1f} CPU s: at most "
              f"{th.cpu / floor:.1f}x for any {dtype} engine (matmuls alone), {th.cpu / (floor + kv_s):.1f}x "
              f"(with the K/V reads)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="64 prompts per workload instead of 256")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per workload (overrides --quick)")
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--skip-hf", action="store_true", help="engine only (profiling)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads for both sides")
    ap.add_argument("--backend", default="auto", help="freight's attention backend (auto, cpu, torch)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="both sides' dtype")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per side and workload, alternating freight and transformers; the fastest of each "
                         "is kept (a shared machine only ever slows a run down)")  # fmt: skip
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n = args.prompts or (64 if args.quick else 256)
    import transformers  # the peer; a dev dependency

    with tempfile.TemporaryDirectory() as tmp:
        path = make_demo_model(Path(tmp) / "llama", "llama", size="medium")
        cfg = transformers.AutoConfig.from_pretrained(path)
        config = EngineConfig(kv_cache_bytes=3 << 29, max_num_batched_tokens=2048, backend=args.backend, dtype=args.dtype)
        engine = Engine.from_pretrained(path, config)
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).eval()
        hf.generation_config.eos_token_id = None
        params = sum(p.numel() for p in hf.parameters())
        non_embed = params - cfg.vocab_size * cfg.hidden_size
        print(f"model: random Llama, {params / 1e6:.1f}M parameters ({non_embed / 1e6:.1f}M without the "
              f"input embedding); torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}, "
              f"freight backend {args.backend}")  # fmt: skip
        rows = []
        for w in workloads(n, cfg.vocab_size):
            engine_runs, hf_runs = [], [Timing(float("nan"), float("nan"))] if args.skip_hf else []
            for r in range(args.repeats):  # alternating; each side's fastest run (by CPU time) is kept
                if r:
                    engine = Engine.from_pretrained(path, config)  # an empty prefix cache, like the first run
                t_engine, counts = run_engine(engine, w)
                engine_runs.append(t_engine)
                if not args.skip_hf:
                    hf_runs.append(run_hf(hf, w, args.hf_batch_size))
            rows.append((w, min(engine_runs, key=lambda t: t.cpu), min(hf_runs, key=lambda t: t.cpu), counts))
        print(f"\n{'workload':<14} {'prompts':>7} {'tokens':>8} {'freight tok/s':>14} {'hf tok/s':>9} "
              f"{'ratio':>6} {'ratio (cpu s)':>13} {'computed/prompt':>16} {'freight cpu s':>14}")  # fmt: skip
        for w, te, th, c in rows:
            print(f"{w.name:<14} {len(w.prompts):>7} {w.tokens:>8} {w.tokens / te.wall:>14.0f} "
                  f"{w.tokens / th.wall:>9.0f} {th.wall / te.wall:>5.1f}x {th.cpu / te.cpu:>12.1f}x "
                  f"{c['computed'] / c['prompt']:>15.1%} {te.cpu:>14.2f}")  # fmt: skip
        rate = matmul_gflops(cfg.hidden_size, cfg.intermediate_size, getattr(torch, args.dtype))
        if not args.skip_hf:
            print_bounds(rows, hf, rate, args.dtype, read_gbps())

        # Decode rate vs the matmul roofline: short prompts, long generations, a full batch.
        decode = Workload(
            "decode", [p[:16] for p in workloads(n, cfg.vocab_size, seed=1)[0].prompts], [64] * n
        )
        before = engine.stats.snapshot()
        t_dec = run_engine(engine, decode)[0].wall
        gen = (engine.stats.snapshot() - before).decode_tokens
        roof = rate * 1e9 / (2 * non_embed)
        print(f"\ndecode: {gen / t_dec:.0f} tokens/s ({n} sequences x 64 tokens, 16-token prompts); "
              f"{args.dtype} matmul {rate:.1f} GFLOP/s -> roofline {roof:.0f} tokens/s (2 x {non_embed / 1e6:.1f}M "
              f"params per token); {gen / t_dec / roof:.0%} of roofline")  # fmt: skip


if __name__ == "__main__":
    main()
