"""Section (e) of bench/gpu_check.py: the engine's exactness on the device.

- every supported architecture (bench/tiny_checkpoints.py, the exactness tests' models, MoE ones
  included): the engine's greedy tokens (Triton backend, fp32) against transformers' on the same
  device and dtype, over the tests' prompt mix (bench/tiny_checkpoints.mixed_prompts);
- decode steps replayed as CUDA graphs against the same steps run eagerly;
- overlapped steps (step n+1 scheduled while step n runs) against serial steps.

A row that differs from its reference counts as exact only when it first differs at a near-tie:
transformers rates the two tokens within NEAR_TIE nats there (TF32 inside the Triton kernels' dot
products rounds differently from cuBLAS's fp32). Any other difference fails the section.
Under --dry-run: the CPU with Triton interpreted, two architectures; the graphs case compares the
static (padded) decode buffers run eagerly, as the CPU has no graphs.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from tiny_checkpoints import ARCHS, hf_greedy, mixed_prompts, save_tiny_checkpoint, tiny_model

from worker.demo_model import make_demo_model
from worker.engine import Engine, EngineConfig, SamplingParams

MAX_NEW = 8
NEAR_TIE = 0.05  # nats between transformers' two candidate tokens where a row may differ
DRY_ARCHS = ("llama", "qwen3_moe")


def _prompts(dry: bool) -> list[list[int]]:
    """The tests' prompt mix; under --dry-run only its short prompts (the interpreter is slow)."""
    return [p for p in mixed_prompts() if not dry or len(p) <= 40]


def _engine_greedy(path: Path, device: torch.device, prompts: list[list[int]], **config: object) -> list[list[int]]:
    cfg = EngineConfig(device=str(device), dtype="float32", backend="triton", kv_cache_bytes=8 << 20,
                       **config)  # fmt: skip
    engine = Engine.from_pretrained(path, cfg)
    outs = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
    bad = [o.error for o in outs if o.error is not None or o.finish_reason != "length"]
    if bad:
        raise RuntimeError(f"requests ended early or in error: {bad[:3]}")
    engine.block_manager.check_invariants([])
    return [o.token_ids for o in outs]


@torch.no_grad()
def _gap(model: torch.nn.Module, prompt: list[int], ours: list[int], theirs: list[int]) -> float:
    """transformers' log-probability gap between its own token and ours where the rows first differ."""
    at = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
    ids = torch.tensor([prompt + theirs[:at]], device=next(model.parameters()).device)
    logp = torch.log_softmax(model(ids).logits[0, -1].float(), dim=-1)
    return float(logp[theirs[at]] - logp[ours[at]])


def _compare(model: torch.nn.Module | None, prompts: list[list[int]], got: list[list[int]],
             want: list[list[int]]) -> dict:  # fmt: skip
    """Identical rows, and the near-tie gap of each differing row (None without a model to ask)."""
    differing = [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b]
    gaps = [None if model is None else _gap(model, prompts[i], got[i], want[i]) for i in differing]
    exact = all(g is not None and g <= NEAR_TIE for g in gaps)
    return {"rows": len(got), "identical": len(got) - len(differing), "gaps": gaps, "exact": exact}


def _print(name: str, row: dict) -> None:
    gaps = ", ".join(f"{g:.3f}" for g in row["gaps"] if g is not None)
    print(f"   {name:<28} identical {row['identical']}/{row['rows']}{f' (near-ties: {gaps} nats)' if gaps else ''}"
          f"{'' if row['exact'] else '  NOT EXACT'}", flush=True)  # fmt: skip


def exactness(chk, device: torch.device) -> None:
    archs = DRY_ARCHS if chk.dry_run else ARCHS
    prompts = _prompts(chk.dry_run)
    report: dict = {"archs": {}, "modes": {}}
    chk.report["exactness"] = report
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="freight-gpu-exact-") as tmp:
        tokenizer_dir = make_demo_model(Path(tmp) / "demo", "llama", size="tiny")
        for arch in archs:

            def one(arch: str = arch) -> None:
                model = tiny_model(arch)
                path = save_tiny_checkpoint(model, Path(tmp) / arch, tokenizer_dir)
                model = model.to(device)
                want = [hf_greedy(model, p, MAX_NEW) for p in prompts]
                row = _compare(model, prompts, _engine_greedy(path, device, prompts), want)
                report["archs"][arch] = row
                _print(arch, row)
                if not row["exact"]:
                    failed.append(arch)

            chk.case(f"exactness {arch}", one)
        path = Path(tmp) / "llama"
        if not path.exists():
            raise RuntimeError("no llama checkpoint to compare decode modes on")
        cuda = device.type == "cuda"
        modes = {
            # the graphs replay the static padded buffers; the CPU runs those buffers eagerly
            "graphs vs eager": ({"cuda_graphs": True} if cuda else {"static_decode": True},
                                {"cuda_graphs": False, "static_decode": False}),
            "overlapped vs serial": ({"overlap_steps": True}, {"overlap_steps": False}),
        }  # fmt: skip
        for name, (on, off) in modes.items():

            def mode(name: str = name, on: dict = on, off: dict = off) -> None:
                got, want = (_engine_greedy(path, device, prompts, **c) for c in (on, off))
                row = _compare(None, prompts, got, want)
                row["exact"] = row["identical"] == row["rows"]  # the same kernels on the same rows
                report["modes"][name] = row
                _print(name, row)
                if not row["exact"]:
                    failed.append(name)

            chk.case(f"exactness {name}", mode)
    if failed:
        raise RuntimeError(f"greedy tokens differ beyond near-ties: {failed}")
