"""An adapter's tensors against its adapter_config.json and the base model: what it wraps, at which
rank and scaling, or AdapterError naming the adapter and the first thing wrong.

PEFT saves each wrapped module's two factors as `base_model.model.<module>.lora_A.weight` ([r, in])
and `...lora_B.weight` ([out, r]). The tensors must be exactly those of the modules the config
targets: a missing factor, a tensor of another kind (a DoRA magnitude, a bias, a saved module, an
embedding factor) or of a module the base does not have, and shapes other than the base's, are each
refused. So are target modules freight does not wrap, and a base_model_name_or_path naming another
model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from contracts.lora.config import AdapterError, LoraAdapterConfig
from contracts.lora.targets import PROJECTIONS, base_modules

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
DTYPES = ("F32", "F16", "BF16")  # the factors' stored dtypes freight loads
_KEY = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])\.weight$")


@dataclass(frozen=True)
class TargetModule:
    """One wrapped module: its factors' tensor names in adapter_model.safetensors, rank and scaling."""

    name: str  # Hugging Face module name, e.g. model.layers.0.self_attn.q_proj
    rank: int
    scaling: float
    a_key: str
    b_key: str


@dataclass(frozen=True)
class AdapterLayout:
    config: LoraAdapterConfig
    modules: tuple[TargetModule, ...]  # in the base's module order

    @property
    def max_rank(self) -> int:
        return max(m.rank for m in self.modules)


def _shown(names: list[str], limit: int = 3) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_adapter(config: LoraAdapterConfig, tensors: dict[str, tuple[str, list[int]]],
                  base_config: dict[str, Any]) -> AdapterLayout:  # fmt: skip
    """tensors: {name: (safetensors dtype, shape)} of adapter_model.safetensors; base_config: the base
    model's config.json (one the engine accepts). Raises AdapterError naming the adapter."""
    who = f"adapter {config.name}"
    supported, others = base_modules(base_config)
    unsupported = [m for m in others if config.targets(m)]
    if unsupported:
        raise AdapterError(
            f"{who} targets {_shown(unsupported)} (target_modules {_target_text(config)}); freight applies LoRA "
            f"to {', '.join(PROJECTIONS)} of dense layers only: retrain the adapter on those, or merge it into "
            "the model"
        )
    targeted = [m for m in supported if config.targets(m)]
    if not targeted:
        raise AdapterError(f"{who} targets no module of this model (target_modules {_target_text(config)}); it "
                           f"is for another base: freight applies LoRA to {', '.join(PROJECTIONS)}")  # fmt: skip
    factors: dict[str, dict[str, str]] = {}
    for key, (dtype, _) in sorted(tensors.items()):
        m = _KEY.match(key)
        if m is None:
            raise AdapterError(f"{who}: {ADAPTER_WEIGHTS} holds {key}, which is no LoRA A or B factor (a bias, a "
                               "DoRA magnitude or a saved module?); freight serves plain LoRA adapters")  # fmt: skip
        module = m.group(1)
        if module not in supported and module not in others:
            raise AdapterError(f"{who}: {ADAPTER_WEIGHTS} holds {key}, for module {module}, which the base model "
                               "does not have: the adapter is for another base")  # fmt: skip
        if module not in targeted:
            raise AdapterError(f"{who}: {ADAPTER_WEIGHTS} holds an extra weight {key}: {ADAPTER_CONFIG}'s "
                               f"target_modules {_target_text(config)} do not wrap {module}")  # fmt: skip
        if dtype not in DTYPES:
            raise AdapterError(f"{who}: {key} is {dtype}; freight loads LoRA factors stored as {', '.join(DTYPES)}")
        factors.setdefault(module, {})[m.group(2)] = key
    missing = [f"{m}.lora_{f}" for m in targeted for f in "AB" if f not in factors.get(m, {})]
    if missing:
        raise AdapterError(f"{who}: {ADAPTER_WEIGHTS} is missing weights of {_shown(missing)}, which "
                           f"{ADAPTER_CONFIG}'s target_modules wrap: the file is incomplete or of another "
                           "adapter")  # fmt: skip
    out = []
    for module in targeted:
        a_key, b_key = factors[module]["A"], factors[module]["B"]
        a, b = tensors[a_key][1], tensors[b_key][1]
        n_in, n_out = supported[module]
        rank = config.rank_of(module)
        if len(a) != 2 or len(b) != 2 or a[1] != n_in or b[0] != n_out:
            raise AdapterError(f"{who}: {module} has A {list(a)} and B {list(b)}, the base's module maps {n_in} -> "
                               f"{n_out} (A [r, {n_in}], B [{n_out}, r]): the adapter is for another base")  # fmt: skip
        if a[0] != rank or b[1] != rank:
            raise AdapterError(f"{who}: {module} has A {list(a)} and B {list(b)}, but {ADAPTER_CONFIG} gives it rank "
                               f"{rank}: the weights and the config are of different adapters")  # fmt: skip
        out.append(TargetModule(module, rank, config.scaling_of(module), a_key, b_key))
    return AdapterLayout(config, tuple(out))


def base_name_problem(config: LoraAdapterConfig, names: list[str | None]) -> str | None:
    """Why the adapter's base_model_name_or_path names another model than the one it would run over,
    known by `names` (its path or URL, the name jobs give it, config.json's _name_or_path), or None.
    Names are compared by their last path component, case aside (a hub id org/Model and a folder
    /models/Model agree); an adapter that names no base passes."""
    wanted = config.base_model_name_or_path
    if wanted is None:
        return None
    leaf = _leaf(wanted)
    known = sorted({_leaf(n) for n in names if n and _leaf(n)})
    if not known or leaf in known:
        return None
    return (f"adapter {config.name} was trained on {wanted} ({ADAPTER_CONFIG}'s base_model_name_or_path), not this "
            f"model ({', '.join(n for n in names if n)}); use an adapter of this model, or, if it is one, set "
            f"base_model_name_or_path to the model's name")  # fmt: skip


def _leaf(name: str) -> str:
    return PurePosixPath(name.strip().rstrip("/")).name.lower()


def _target_text(config: LoraAdapterConfig) -> str:
    t = config.target_modules
    return repr(t) if isinstance(t, str) else "[" + ", ".join(t) + "]"
