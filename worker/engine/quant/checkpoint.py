"""The offline step: a full-precision checkpoint folder -> a freight-quantized checkpoint folder.

Decoder Linear weights (every nn.Linear of the engine's model but lm_head, unless QuantizeSpec.lm_head
asks for it too: round to nearest in the method's format, GPTQ included) are written as
`<hf module>.qweight` / `<hf module>.scales` in freight's layouts, under the checkpoint's own
(unfused) names, which the engine's loader stacks into its fused modules row by row; every other
tensor and file is copied unchanged, and config.json gains a `quantization_config`. The folder is
built beside the output and renamed into place, so a failure writes nothing.

GPTQ runs the calibration prompts through an fp32 Engine on the CPU (prefix caching off), one pass
per decoder layer (calibration.SequentialHessians), and quantizes each engine module once: q/k/v
(and gate/up) share one input, hence one Hessian, so their stacked rows are one GPTQ problem.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import structlog
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from kernels.reference.fp8_matmul import quantize_fp8_rows
from worker.engine.quant.config import QuantizationConfig
from worker.engine.quant.formats import check_group_size, pack_int4, quantize_int4, quantize_int8
from worker.engine.quant.gptq import GPTQConfig, gptq_quantize_int4

log = structlog.get_logger(__name__)
METHODS = ("int8", "int4-rtn", "int4-gptq", "fp8")


@dataclass(frozen=True)
class QuantizeSpec:
    method: str  # "int8" | "int4-rtn" | "int4-gptq" | "fp8" (e4m3 weights, fp32 per-channel scales)
    group_size: int = 128  # int4 only
    damp: float = 0.01  # GPTQ: fraction of mean(diag H) added before inverting
    act_order: bool = False  # GPTQ: visit columns by decreasing Hessian diagonal (static groups)
    max_calibration_tokens: int = 512  # per calibration row, after tokenizing
    lm_head: bool = False  # quantize the output head too (int8 / int4, round to nearest)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown quantization method {self.method!r}; use one of {METHODS}")
        if self.method.startswith("int4"):
            QuantizationConfig(bits=4, group_size=self.group_size)  # validates the group size
        GPTQConfig(group_size=self.group_size, damp=self.damp, act_order=self.act_order)
        if self.max_calibration_tokens < 2:
            raise ValueError("max_calibration_tokens must be at least 2")
        if self.lm_head and self.method == "fp8":
            raise ValueError("--lm-head quantizes the head to int8 or int4; fp8 keeps it in full precision")

    @property
    def quantization_config(self) -> QuantizationConfig:
        if self.method == "fp8":
            return QuantizationConfig(bits=8, weight_format="fp8_e4m3")
        bits = 8 if self.method == "int8" else 4
        return QuantizationConfig(
            bits=bits, group_size=self.group_size, method="gptq" if self.method == "int4-gptq" else "rtn",
            lm_head=self.lm_head,
        )


def _load_all(model_dir: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    from worker.engine.loader import checkpoint_files, read_config

    raw = read_config(model_dir)
    if "quantization_config" in raw:
        raise ValueError(
            f"{model_dir} is already quantized ({raw['quantization_config'].get('quant_method')}); "
            "quantize a full-precision checkpoint"
        )
    tensors: dict[str, torch.Tensor] = {}
    for file in checkpoint_files(model_dir):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensors[name] = f.get_tensor(name)
    return raw, tensors


def linear_weight_names(raw_config: dict, tensors: dict[str, torch.Tensor],
                        lm_head: bool = False) -> dict[str, tuple[str, int]]:  # fmt: skip
    """Checkpoint name of each decoder Linear weight (and lm_head's, when asked) -> (engine module it
    loads into, shard index). Raises ValueError for lm_head when the checkpoint ties it to the
    embeddings.

    The shard index orders the rows of a fused module (q, k, v; gate, up); 0 for unfused ones.
    """
    from worker.engine.backends import select_backend
    from worker.engine.loader import internal_name
    from worker.engine.models import CausalLM, ModelConfig
    from worker.engine.quant.swap import decoder_linears

    cfg = ModelConfig.from_dict(raw_config)
    with torch.device("meta"):
        model = CausalLM(cfg, select_backend("torch", torch.device("cpu")), 16)
    modules = {name for name, _ in decoder_linears(model, lm_head=lm_head)}
    if lm_head and (cfg.tie_word_embeddings or "lm_head.weight" not in tensors):
        raise ValueError("this model ties lm_head to its embeddings (no lm_head.weight of its own): "
                         "quantize it without --lm-head")  # fmt: skip
    out = {}
    for name in tensors:
        if name.endswith(".weight"):
            internal, shard = internal_name(name)
            module = internal.removesuffix(".weight")
            if module in modules:
                out[name] = (module, shard or 0)
    return out


def quantize_checkpoint(
    model_dir: Path, output: Path, spec: QuantizeSpec, calibration_texts: list[str] | None = None
) -> dict[str, int]:
    """Write the quantized checkpoint folder `output`; returns weight bytes before/after.

    Raises ValueError, writing nothing, for a missing or already quantized model, an existing
    non-empty output, a group size that does not divide a layer's input, or GPTQ without
    calibration texts.
    """
    model_dir, output = Path(model_dir), Path(output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ValueError(f"output {output} already exists and is not an empty folder; choose a new path")
    if spec.method == "int4-gptq" and not calibration_texts:
        raise ValueError("int4-gptq needs calibration data: pass --calibration DATA.parquet")
    raw, tensors = _load_all(model_dir)
    targets = linear_weight_names(raw, tensors, spec.lm_head)
    if spec.method.startswith("int4"):
        for name in targets:
            check_group_size(tensors[name].shape[1], spec.group_size, name)

    if spec.method == "int4-gptq":  # the head (no decoder layer's Hessian covers it) round to nearest
        head = {n: t for n, t in targets.items() if t[0] == "lm_head"}
        layers = {n: t for n, t in targets.items() if n not in head}
        quantized = _gptq_all(model_dir, layers, tensors, spec, calibration_texts or [])
        quantized.update({n: quantize_int4(tensors[n], spec.group_size) for n in head})
    else:
        rtn = {"int8": quantize_int8, "fp8": quantize_fp8_rows}.get(
            spec.method, lambda w: quantize_int4(w, spec.group_size)
        )
        quantized = {name: rtn(tensors[name]) for name in targets}
    out_tensors = {k: v for k, v in tensors.items() if k not in targets}
    for name, (qweight, scales) in quantized.items():
        base = name.removesuffix(".weight")
        src_dtype = tensors[name].dtype
        out_tensors[f"{base}.qweight"] = qweight.contiguous()
        # fp8's scales stay fp32 (what torch._scaled_mm takes; fp16 would flush small ones)
        keep_fp32 = src_dtype == torch.float32 or spec.method == "fp8"
        out_tensors[f"{base}.scales"] = scales.to(torch.float32 if keep_fp32 else torch.float16).contiguous()
    raw = dict(raw, quantization_config=spec.quantization_config.to_dict())
    _write_folder(model_dir, output, raw, out_tensors)
    sizes = {
        "linear_bytes_before": sum(tensors[n].numel() * tensors[n].element_size() for n in targets),
        "linear_bytes_after": sum(
            out_tensors[n.removesuffix(".weight") + s].nbytes
            for n in targets
            for s in (".qweight", ".scales")
        ),
        "linear_params": sum(tensors[n].numel() for n in targets),
    }
    log.info(
        "checkpoint quantized",
        model=str(model_dir),
        output=str(output),
        method=spec.method,
        group_size=spec.group_size,
        lm_head=spec.lm_head,
        layers=len(targets),
        **sizes,
    )
    return sizes


def _gptq_all(
    model_dir: Path,
    targets: dict[str, tuple[str, int]],
    tensors: dict[str, torch.Tensor],
    spec: QuantizeSpec,
    texts: list[str],
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    from worker.engine import Engine, EngineConfig, SamplingParams
    from worker.engine.quant.calibration import SequentialHessians

    engine = Engine.from_pretrained(
        model_dir, EngineConfig(device="cpu", dtype="float32", enable_prefix_caching=False)
    )
    limit = min(spec.max_calibration_tokens, engine.max_model_len - 1)
    prompts = [ids[:limit] for ids in (engine.tokenizer.encode(t) for t in texts) if ids]
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    layers = engine.runner.model.model.layers
    calib = SequentialHessians(layers, lambda p: engine.generate(p, params), prompts)
    gcfg = GPTQConfig(group_size=spec.group_size, damp=spec.damp, act_order=spec.act_order)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for i, hessians in calib.layers():
        prefix = f"model.layers.{i}."
        for local, module in layers[i].named_modules():
            if not (isinstance(module, torch.nn.Linear) and local in hessians):
                continue
            # the module's checkpoint tensors in shard order (q, k, v / gate, up): stacked rows
            shards = sorted((shard, n) for n, (m, shard) in targets.items() if m == prefix + local)
            names = [n for _, n in shards]
            q, scales = gptq_quantize_int4(
                torch.cat([tensors[n] for n in names]), hessians[local].hessian, gcfg
            )
            # the engine module now computes with its quantized weight, for the next layers' inputs
            module.weight.data.copy_(q.float() * scales.repeat_interleave(spec.group_size, dim=1))
            row = 0
            for n in names:
                rows = tensors[n].shape[0]
                out[n] = (pack_int4(q[row : row + rows]), scales[row : row + rows])
                row += rows
        log.info("gptq layer done", layer=i, rows=next(iter(hessians.values())).rows)
    missing = set(targets) - set(out)
    if missing:
        raise ValueError(f"GPTQ found no decoder layer for {sorted(missing)[:3]}")
    return out


def _write_folder(model_dir: Path, output: Path, raw: dict, tensors: dict[str, torch.Tensor]) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        for src in model_dir.iterdir():
            skip = src.suffix == ".safetensors" or src.name in ("config.json", "model.safetensors.index.json")
            if src.is_file() and not skip:
                shutil.copy2(src, tmp / src.name)
        (tmp / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if output.exists():
            output.rmdir()  # checked empty above
        tmp.rename(output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
