"""freight's engine vs transformers `generate` on a random Mixtral-shaped model (8 experts, top-2, small
dims), on bench/engine_vs_hf.py's mixed workload; and the grouped expert GEMM's rate against one dense
matmul of the same FLOPs.

    .venv/bin/python bench/moe_vs_hf.py --threads 1                 # 64 prompts per side (a few minutes)
    .venv/bin/python bench/moe_vs_hf.py --threads 1 --prompts 256   # the full mixed workload
    .venv/bin/python bench/moe_vs_hf.py --threads 1 --gemm-only     # the GEMM rates alone

The CPU-time ratio is the fair one on a shared machine with --threads 1 (engine_vs_hf.py's note).
Grouped GEMM: the CPU backend's fused_moe, what the engine runs (gather by expert, one matmul + C
SiLU*up + one matmul per expert, C GEMVs for experts with <= 8 rows, weighted index_add back) on T
tokens routed top-2 over 8 experts, against the same work as a dense MLP over the T * 2 rows (two
matmuls + SiLU*up), GFLOP/s each. At decode sizes the experts' weights (8x the dense MLP's) are read
from memory, not cache: there the grouped rate is bound by bandwidth, not by the grouping.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
from engine_vs_hf import Timing, run_engine, run_hf, workloads

from kernels.reference.activation import silu_mul
from kernels.reference.fused_moe import select_experts
from worker.demo_model import make_demo_model
from worker.engine import Engine, EngineConfig
from worker.engine.backends.cpu_backend import CpuBackend

# Mixtral's layout at small dims: 8 experts, top-2, GQA 8/4 heads, expert FFN 2x hidden
SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=4096)  # fmt: skip


def make_mixtral(out: Path) -> Path:
    """A random Mixtral checkpoint saved by transformers, with the demo tokenizer (vocab 2048)."""
    import transformers

    tok = make_demo_model(out / "tokenizer", "llama", size="small")
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=2048, bos_token_id=0, eos_token_id=2, **SHAPE)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    path = out / "mixtral"
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tok / name, path / name)
    return path


def _rate(fn, flops: float, seconds: float) -> float:
    for _ in range(3):
        fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return flops * n / (time.perf_counter() - t0) / 1e9


def gemm_rates(tokens: int, seconds: float = 2.0) -> tuple[float, float]:
    """(grouped experts GFLOP/s, dense MLP of the same FLOPs GFLOP/s) at Mixtral's small shape."""
    hidden, inter, experts, top_k = SHAPE["hidden_size"], SHAPE["intermediate_size"], 8, 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) * 0.05
    w2 = torch.randn(experts, hidden, inter, generator=g) * 0.05
    weights, ids = select_experts(torch.randn(tokens, experts, generator=g), top_k, renormalize=True)
    rows = tokens * top_k
    flops = 2 * rows * (hidden * 2 * inter + inter * hidden)
    xd = torch.randn(rows, hidden, generator=g)

    def dense() -> torch.Tensor:
        return silu_mul(xd @ w13[0].t()) @ w2[0].t()

    backend = CpuBackend()
    grouped = _rate(lambda: backend.fused_moe(x, w13, w2, weights, ids), flops, seconds)
    return grouped, _rate(dense, flops, seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64, help="prompts in the mixed workload")
    ap.add_argument("--hf-batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads for both sides")
    ap.add_argument("--gemm-only", action="store_true", help="only the grouped-vs-dense GEMM rates")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for tokens in (16, 128, 512, 2048):
        grouped, dense = gemm_rates(tokens)
        print(f"grouped experts, {tokens:>4} tokens top-2 of 8: {grouped:6.1f} GFLOP/s; dense MLP of the same "
              f"FLOPs {dense:6.1f} GFLOP/s: {grouped / dense:.0%}")  # fmt: skip
    if args.gemm_only:
        return
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        path = make_mixtral(Path(tmp))
        engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=1 << 29, max_num_batched_tokens=2048))
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        hf.generation_config.eos_token_id = None
        params = sum(p.numel() for p in hf.parameters())
        print(f"model: random Mixtral, {params / 1e6:.1f}M parameters, 8 experts top-2, {SHAPE}")
        w = workloads(args.prompts, 2048)[0]  # mixed: prompts of 16..512 tokens, max_tokens 16..128
        t_engine, _ = run_engine(engine, w)
        t_hf: Timing = run_hf(hf, w, args.hf_batch_size)
        print(f"mixed workload, {len(w.prompts)} prompts, {w.tokens} tokens: freight {t_engine.cpu:.1f} CPU s "
              f"({t_engine.wall:.1f} s wall), transformers {t_hf.cpu:.1f} CPU s ({t_hf.wall:.1f} s wall): "
              f"{t_hf.cpu / t_engine.cpu:.1f}x (CPU s), {t_hf.wall / t_engine.wall:.1f}x (wall)")  # fmt: skip


if __name__ == "__main__":
    main()
