"""CPU speed of freight's quantized Linears (int8 / int4 weight-only, fp8 through its exact CPU
reference) and of the engine decoding with them.

Used by bench/quant_quality.py (which prints these tables after the quality ones); times are CPU
time (thread or process), which other tenants of a shared machine do not inflate.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from worker.engine import Engine, EngineConfig, SamplingParams

KV_BYTES = 256 << 20


def cpu_engine(model_dir: Path, quantization: str | None = None) -> Engine:
    return Engine.from_pretrained(
        model_dir,
        EngineConfig(
            device="cpu",
            dtype="float32",
            kv_cache_bytes=KV_BYTES,
            enable_prefix_caching=False,
            quantization=quantization,
        ),
    )


def big_random_model(src: Path, out: Path, hidden: int, layers: int) -> Path:
    """A random Llama with the reference model's tokenizer: `layers` x hidden `hidden`, MLP 2.75x."""
    cfg = json.loads((src / "config.json").read_text())
    inter = int(hidden * 2.75) // 128 * 128
    cfg.update(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 128,
        num_key_value_heads=hidden // 256,
        head_dim=128,
    )
    g = torch.Generator().manual_seed(0)
    kv = cfg["num_key_value_heads"] * 128
    shapes = {
        "model.embed_tokens.weight": (cfg["vocab_size"], hidden),
        "lm_head.weight": (cfg["vocab_size"], hidden),
        "model.norm.weight": (hidden,),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "self_attn.q_proj.weight": (hidden, hidden),
                p + "self_attn.k_proj.weight": (kv, hidden),
                p + "self_attn.v_proj.weight": (kv, hidden),
                p + "self_attn.o_proj.weight": (hidden, hidden),
                p + "mlp.gate_proj.weight": (inter, hidden),
                p + "mlp.up_proj.weight": (inter, hidden),
                p + "mlp.down_proj.weight": (hidden, inter),
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
            }
        )
    tensors = {
        n: (torch.ones(s) if len(s) == 1 else torch.randn(s, generator=g) * s[-1] ** -0.5).half()
        for n, s in shapes.items()
    }
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name not in ("model.safetensors", "config.json") and f.is_file():
            shutil.copy2(f, out / f.name)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(tensors, str(out / "model.safetensors"))
    return out


def decode_speed(model_dir: Path, label: str, new_tokens: int, batches: tuple[int, ...]) -> None:
    """Greedy decode throughput: tokens per wall second and per CPU second (process time, all threads)."""
    print(f"\nCPU decode, {label} ({torch.get_num_threads()} threads, {new_tokens} new tokens each): "
          "tokens/s wall | tokens per CPU-second")
    print(f"{'weights':8} " + " ".join(f"{f'batch {b}':>17}" for b in batches))
    results: dict[str, list[float]] = {}
    for quant in (None, "int8", "int4", "fp8"):
        engine = cpu_engine(model_dir, quant)
        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
        engine.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=2, ignore_eos=True))  # warm up
        walls, cpus = [], []
        for b in batches:
            prompts = [[5 + i, 6, 7, 8] for i in range(b)]
            t0, c0 = time.perf_counter(), time.process_time()
            engine.generate(prompts, params)
            walls.append(b * new_tokens / (time.perf_counter() - t0))
            cpus.append(b * new_tokens / (time.process_time() - c0))
        results[quant or "fp32"] = cpus
        print(f"{quant or 'fp32':8} " + " ".join(f"{w:8.1f} |{c:7.1f}" for w, c in zip(walls, cpus, strict=True)),
              flush=True)
    for quant in ("int8", "int4", "fp8"):
        ratios = [q / f for q, f in zip(results[quant], results["fp32"], strict=True)]
        print(f"{quant} / fp32 per CPU-second: "
              + "  ".join(f"batch {b}: {r:.2f}x" for b, r in zip(batches, ratios, strict=True)))


def matmul_speed(shapes: tuple[tuple[int, int], ...], batches: tuple[int, ...]) -> None:
    """One Linear (fp32 activations) per weight format: nn.Linear fp32 vs Int8Linear vs Int4Linear (G 128)
    vs Fp8Linear (the CPU's exact reference path).

    One thread, timed in that thread's CPU time (time.thread_time): on a shared machine wall time
    mostly measures the other tenants, CPU time measures the kernel.
    """
    from worker.engine.quant import Fp8Linear, Int4Linear, Int8Linear

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    print("\nCPU Linear microseconds per call (thread CPU time), fp32 activations, 1 thread")
    print(f"{'N x K':12} {'M':>3} {'fp32':>9} {'int8':>9} {'int4':>9} {'fp8':>9} {'int8 x':>7} {'int4 x':>7} {'fp8 x':>7}")
    for n, k in shapes:
        dense = torch.nn.Linear(k, n, bias=False).requires_grad_(False)
        mods = (dense, Int8Linear.from_linear(dense), Int4Linear.from_linear(dense, 128), Fp8Linear.from_linear(dense))
        for m in batches:
            x = torch.randn(m, k)
            us = []
            with torch.no_grad():
                for mod in mods:
                    mod(x)
                    reps, t0 = 0, time.thread_time()
                    while time.thread_time() - t0 < 0.3:
                        mod(x)
                        reps += 1
                    us.append((time.thread_time() - t0) / reps * 1e6)
            print(
                f"{f'{n} x {k}':12} {m:3d} {us[0]:9.0f} {us[1]:9.0f} {us[2]:9.0f} {us[3]:9.0f} "
                f"{us[0] / us[1]:6.2f}x {us[0] / us[2]:6.2f}x {us[0] / us[3]:6.2f}x",
                flush=True,
            )
    torch.set_num_threads(threads)
