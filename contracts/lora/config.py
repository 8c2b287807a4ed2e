"""adapter_config.json of a PEFT LoRA adapter: the fields that shape its product, and the options
freight refuses because they change the math it computes (y = W x + scaling * B A x per module).

PEFT's rules are followed for what it saves: `r` and `lora_alpha` per module unless `rank_pattern` /
`alpha_pattern` name it (peft.utils.other.get_pattern_key: a key matches a module name that ends
with it, as a regular expression after an optional prefix); scaling = alpha / r, or alpha / sqrt(r)
with `use_rslora`. Options that only shape training (dropout, initialisation, task type) are read
and ignored.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

MAX_LORA_RANK = 64  # the largest rank the kernels take (kernels/reference/lora.py)
MAX_LORAS = 256  # adapter slots on a device, at most (each holds every wrapped projection's factors)
ALL_LINEAR = "all-linear"  # PEFT's shorthand for every linear layer but the output head
# Options that change what an adapter computes, each with the value that leaves the plain LoRA
# product alone. Any other value is refused, naming the option.
_PLAIN: dict[str, Any] = {
    "use_dora": False,
    "fan_in_fan_out": False,
    "bias": "none",
    "lora_bias": False,
    "modules_to_save": None,
    "layer_replication": None,
    "target_parameters": None,
    "trainable_token_indices": None,
    "alora_invocation_tokens": None,
    "use_qalora": False,
    "use_bdlora": None,
    "arrow_config": None,
    "kasa_config": None,
    "velora_config": None,
    "monteclora_config": None,
}


class AdapterError(ValueError):
    """An adapter freight cannot serve over this base; the message names the adapter and says why."""


def _empty(value: Any) -> bool:
    return value is None or value is False or value == "none" or (isinstance(value, list | dict | str) and not value)


@dataclass(frozen=True)
class LoraAdapterConfig:
    """The LoRA fields of one adapter_config.json (`parse` validates them)."""

    name: str  # the adapter's name in the job (--lora NAME=PATH): every message names it
    rank: int
    alpha: float
    use_rslora: bool = False
    target_modules: tuple[str, ...] | str = ()  # module-name suffixes, or one regular expression
    exclude_modules: tuple[str, ...] | str = ()
    layers_to_transform: tuple[int, ...] | None = None
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    base_model_name_or_path: str | None = None

    @classmethod
    def parse(cls, name: str, raw: Any) -> LoraAdapterConfig:
        """adapter_config.json's parsed contents -> the config; AdapterError naming the adapter and the
        field for anything freight cannot serve."""
        where = f"adapter {name}: adapter_config.json"
        if not isinstance(raw, dict):
            raise AdapterError(f"{where} must hold a JSON object")
        kind = raw.get("peft_type")
        if kind != "LORA":
            raise AdapterError(f"adapter {name} is a {kind or 'untyped'} PEFT adapter (peft_type); freight serves "
                               "LoRA adapters (peft_type LORA)")  # fmt: skip
        for key, plain in _PLAIN.items():
            if key in raw and not _empty(raw[key]) and raw[key] != plain:
                raise AdapterError(f"{where} sets {key}={raw[key]!r}, which changes the LoRA product freight "
                                   f"computes (it serves plain LoRA: {key} {plain!r}); merge the adapter into "
                                   "the model and serve that instead")  # fmt: skip
        pattern = raw.get("layers_pattern")
        if not _empty(pattern) and pattern not in ("layers", ["layers"]):
            raise AdapterError(f"{where}: layers_pattern {pattern!r} names no layer list of the supported "
                               "models (they are model.layers.N)")  # fmt: skip
        rank = _rank(where, "r", raw.get("r", 8))
        alpha = _number(where, "lora_alpha", raw.get("lora_alpha", 8))
        ranks = _pattern(where, "rank_pattern", raw.get("rank_pattern"), lambda k, v: _rank(where, f"rank_pattern[{k!r}]", v))
        alphas = _pattern(where, "alpha_pattern", raw.get("alpha_pattern"),
                          lambda k, v: _number(where, f"alpha_pattern[{k!r}]", v))  # fmt: skip
        base = raw.get("base_model_name_or_path")
        return cls(
            name=name, rank=rank, alpha=alpha, use_rslora=bool(raw.get("use_rslora", False)),
            target_modules=_names(where, "target_modules", raw.get("target_modules")),
            exclude_modules=_names(where, "exclude_modules", raw.get("exclude_modules")),
            layers_to_transform=_layers(where, raw.get("layers_to_transform")),
            rank_pattern=ranks, alpha_pattern=alphas,
            base_model_name_or_path=base if isinstance(base, str) and base.strip() else None,
        )  # fmt: skip

    def targets(self, module: str) -> bool:
        """Whether PEFT wraps the module of this Hugging Face name (peft's check_target_module_exists,
        for the names of a decoder's layers)."""
        if _matches(self.exclude_modules, module):
            return False
        if self.target_modules == (ALL_LINEAR,):
            wanted = module.rsplit(".", 1)[-1] not in ("lm_head", "embed_tokens")  # linear layers but the head
        elif isinstance(self.target_modules, str):
            return bool(re.fullmatch(self.target_modules, module))
        else:
            wanted = _matches(self.target_modules, module)
        if not wanted:
            return False
        if self.layers_to_transform is not None:
            m = re.match(r".*?\.[^.]*\.(\d+)\.", module)
            return m is not None and int(m.group(1)) in self.layers_to_transform
        return True

    def rank_of(self, module: str) -> int:
        return self.rank_pattern.get(_pattern_key(self.rank_pattern, module), self.rank)

    def scaling_of(self, module: str) -> float:
        """The factor of the module's B A x: alpha / r (alpha / sqrt(r) with use_rslora)."""
        alpha = self.alpha_pattern.get(_pattern_key(self.alpha_pattern, module), self.alpha)
        r = self.rank_of(module)
        return alpha / math.sqrt(r) if self.use_rslora else alpha / r


def _matches(keys: tuple[str, ...] | str, module: str) -> bool:
    if isinstance(keys, str):
        return bool(keys) and bool(re.fullmatch(keys, module))
    return any(module == k or module.endswith("." + k) for k in keys)


def _pattern_key(pattern: dict[str, Any], module: str) -> str:
    """peft.utils.other.get_pattern_key: the first key matching the module's name, else the name."""
    for key in pattern:
        if re.match(rf"(.*\.)?({key})$", module):
            return key
    return module


def _rank(where: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise AdapterError(f"{where}: {key} must be a positive integer, not {value!r}")
    if value > MAX_LORA_RANK:
        raise AdapterError(f"{where}: {key} is {value}, over the largest rank freight serves ({MAX_LORA_RANK}); "
                           "train the adapter at a rank up to that, or merge it into the model")  # fmt: skip
    return value


def _number(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise AdapterError(f"{where}: {key} must be a number, not {value!r}")
    return float(value)


def _pattern(where: str, key: str, value: Any, check: Any) -> dict[str, Any]:
    if _empty(value):
        return {}
    if not isinstance(value, dict):
        raise AdapterError(f"{where}: {key} must be an object of module name -> value")
    out = {}
    for k, v in value.items():
        try:
            re.compile(k)
        except re.error as exc:
            raise AdapterError(f"{where}: {key} key {k!r} is not a regular expression ({exc})") from None
        out[k] = check(k, v)
    return out


def _names(where: str, key: str, value: Any) -> tuple[str, ...] | str:
    if _empty(value):
        return ()
    if isinstance(value, str):
        if value.lower() == ALL_LINEAR:
            return (ALL_LINEAR,)
        try:
            re.compile(value)
        except re.error as exc:
            raise AdapterError(f"{where}: {key} {value!r} is not a regular expression ({exc})") from None
        return value
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return tuple(sorted(set(value)))
    raise AdapterError(f"{where}: {key} must be a list of module names or one regular expression")


def _layers(where: str, value: Any) -> tuple[int, ...] | None:
    if value is None or value == []:
        return None
    values = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise AdapterError(f"{where}: layers_to_transform must be a layer index or a list of them")
    return tuple(sorted(set(values)))
