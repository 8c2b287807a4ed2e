"""Section (d) of bench/gpu_check.py: the engine end to end on a random Llama with a mixed batch.

On a GPU: ~1B parameters in bf16 (Llama-3.2-1B's shape: hidden 2048, 16 layers, 32 query heads over
8 KV heads of 64, MLP 8192; the demo tokenizer's small vocabulary), random weights written once to
a temporary folder. The batch mixes long and short prompts, a shared prefix (prefix-cache hits and
chunked prefill) and different output lengths, greedy, EOS ignored so every request runs its full
length. Three runs of the same batch: "triton" (the kernels), "torch" (the references on the same
GPU; the peer) and "triton+int4" (weights quantized at load, int4 RTN group 128, through the int4
kernel; int8 under --dry-run); tokens/s and the ratios go to the report.
Under --dry-run: the tiny demo model on the CPU, Triton interpreted, a handful of prompts.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import random
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from contracts.constraint import Constraint
from worker.demo_model import make_demo_model
from worker.engine import Engine, EngineConfig, SamplingParams

LLAMA_1B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}


def _write_llama_1b(folder: Path, device: torch.device) -> int:
    """Overwrite the demo checkpoint in `folder` with random 1B-shaped bf16 weights; returns the
    parameter count."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update(LLAMA_1B)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    h, ffn, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q_out = config["num_attention_heads"] * config["head_dim"]
    kv_out = config["num_key_value_heads"] * config["head_dim"]
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * std).to(torch.bfloat16).cpu()

    def norm(n: int) -> torch.Tensor:
        return (1.0 + torch.randn(n, generator=gen, device=device) * 0.05).to(torch.bfloat16).cpu()

    weights = {"model.embed_tokens.weight": rand(vocab, h, std=0.5), "model.norm.weight": norm(h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, shape in (
            ("self_attn.q_proj", (q_out, h)),
            ("self_attn.k_proj", (kv_out, h)),
            ("self_attn.v_proj", (kv_out, h)),
            ("self_attn.o_proj", (h, q_out)),
            ("mlp.gate_proj", (ffn, h)),
            ("mlp.up_proj", (ffn, h)),
            ("mlp.down_proj", (h, ffn)),
        ):
            weights[p + name + ".weight"] = rand(*shape)
        weights[p + "input_layernorm.weight"] = norm(h)
        weights[p + "post_attention_layernorm.weight"] = norm(h)
    save_file(weights, str(folder / "model.safetensors"), {"format": "pt"})
    return sum(t.numel() for t in weights.values())


def _batch(vocab: int, dry: bool) -> tuple[list[list[int]], list[SamplingParams]]:
    """Mixed batch: a quarter share a long prefix; prompt and output lengths spread wide."""
    rng = random.Random(0)
    n, shared_len, lo, hi, out_lo, out_hi = (6, 20, 3, 40, 2, 5) if dry else (256, 512, 16, 1024, 16, 256)
    shared = [rng.randrange(3, vocab) for _ in range(shared_len)]
    prompts, params = [], []
    for i in range(n):
        body = [rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))]
        prompts.append(shared + body if i % 4 == 0 else body)
        params.append(
            SamplingParams(max_tokens=rng.randint(out_lo, out_hi), temperature=0.0, ignore_eos=True)
        )
    return prompts, params


def _run(model_dir: Path, label: str, device: torch.device, dry: bool, prompts, params) -> dict:
    backend, _, quant = label.partition("+")
    config = EngineConfig(
        device=str(device),
        backend=backend,
        dtype="float32" if dry else "bfloat16",
        quantization=quant or None,
        max_num_seqs=8 if dry else 256,
        max_num_batched_tokens=32 if dry else 8192,
        kv_cache_bytes=(1 << 24) if dry else (24 << 30),
    )  # 24 GiB: ~750k tokens
    engine = Engine.from_pretrained(model_dir, config)
    engine.generate(prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True))  # compile / warm up
    before = engine.stats.snapshot()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    out_tokens = sum(len(o.token_ids) for o in outs)
    prompt_tokens = sum(o.prompt_tokens for o in outs)
    delta = engine.stats.snapshot() - before
    cached = delta.cached_tokens
    del engine
    gc.collect()  # free the KV cache before the next backend's engine allocates its own
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "backend": label,
        "requests": len(outs),
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "output_tokens": out_tokens,
        "wall_seconds": wall,
        "output_tokens_per_s": out_tokens / wall,
        "total_tokens_per_s": (prompt_tokens + out_tokens) / wall,
        "errors": sum(o.finish_reason == "error" for o in outs),
        "token_ids": [o.token_ids for o in outs],
        "steps": delta.steps,
        "mask_seconds": delta.mask_seconds,
        "stopped": sum(o.finish_reason == "stop" for o in outs),
    }


def engine_end_to_end(chk, device: torch.device) -> None:
    dry = chk.dry_run
    with tempfile.TemporaryDirectory(prefix="freight-gpu-check-") as tmp:
        folder = make_demo_model(Path(tmp) / "model", "llama", size="tiny")
        params_count = None if dry else _write_llama_1b(folder, device)
        vocab = json.loads((folder / "config.json").read_text(encoding="utf-8"))["vocab_size"]
        prompts, params = _batch(vocab, dry)
        quantized = "triton+int8" if dry else "triton+int4"  # the tiny model's 64-wide layers: no group 128
        runs: dict[str, dict] = {}
        for label in ("triton", "torch", quantized):  # each fails soft: one broken backend hides no other
            chk.case(
                f"engine {label}",
                lambda b=label: runs.__setitem__(b, _run(folder, b, device, dry, prompts, params)),
            )
            if label in runs:
                _print_run(runs[label])
        report: dict = {"parameters": params_count, "runs": runs}
        chk.case("engine structured", _structured, chk, folder, device, prompts, params, runs, report)
        from gpu_check_speculative import speculative_case

        chk.case("engine speculative (ngram)", lambda: speculative_case(chk, device, folder, vocab))
    chk.report["engine"] = report
    if "triton" in runs and "torch" in runs:
        pairs = zip(runs["triton"]["token_ids"], runs["torch"]["token_ids"], strict=True)
        report["same_greedy_outputs"] = sum(a == b for a, b in pairs)
        report["triton_over_torch"] = (
            runs["triton"]["total_tokens_per_s"] / runs["torch"]["total_tokens_per_s"]
        )
        print(
            f"   triton / torch: x{report['triton_over_torch']:.2f}; identical greedy outputs: "
            f"{report['same_greedy_outputs']}/{len(prompts)} (bf16: near-ties may flip)",
            flush=True,
        )
    if "triton" in runs and quantized in runs:
        report["quantized_over_bf16"] = (
            runs[quantized]["total_tokens_per_s"] / runs["triton"]["total_tokens_per_s"]
        )
        print(f"   {quantized} / triton: x{report['quantized_over_bf16']:.2f}", flush=True)
    for r in runs.values():
        r.pop("token_ids")
    errors = {label: r["errors"] for label, r in runs.items() if r["errors"]}
    if errors:
        raise RuntimeError(f"requests ended in error: {errors}")


def _structured(chk, folder: Path, device: torch.device, prompts, params, runs: dict, report: dict) -> None:
    """The same batch with bench/nested_schema.json on every row (triton backend): throughput per
    token against the unconstrained run (constrained rows stop when their object is complete), the
    host's mask time per step."""
    schema = json.loads((Path(__file__).parent / "nested_schema.json").read_text(encoding="utf-8"))
    constraint = Constraint.json_schema(schema)
    shaped = [dataclasses.replace(p, constraint=constraint) for p in params]
    r = _run(folder, "triton", device, chk.dry_run, prompts, shaped)
    r["backend"] = "triton+json_schema"
    _print_run(r)
    runs["triton+json_schema"] = r
    per_step = r["mask_seconds"] / max(1, r["steps"])
    print(f"   mask fill {per_step * 1e3:.3f} ms per step; {r['stopped']}/{r['requests']} rows completed the schema",
          flush=True)  # fmt: skip
    if "triton" in runs:
        report["structured_over_unconstrained"] = r["total_tokens_per_s"] / runs["triton"]["total_tokens_per_s"]
        print(f"   json schema / unconstrained: x{report['structured_over_unconstrained']:.2f} (tokens per second)",
              flush=True)  # fmt: skip


def _print_run(r: dict) -> None:
    print(
        f"   {r['backend']:<11} {r['requests']} requests, {r['prompt_tokens']} prompt ({r['cached_tokens']} cached)"
        f" + {r['output_tokens']} output tokens in {r['wall_seconds']:.1f} s: "
        f"{r['output_tokens_per_s']:.0f} output tok/s, {r['total_tokens_per_s']:.0f} total tok/s",
        flush=True,
    )
