"""Adapters freight cannot serve are refused, naming the adapter, by the submit-time check (from the
files' JSON and safetensors header, no torch) and by the engine's loader alike: another base's
shapes, layers or name, a rank over the limit, target modules it does not wrap, options that change
the product, missing or extra weights, missing or pickled files."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from contracts.lora.config import MAX_LORA_RANK, AdapterError, LoraAdapterConfig
from jobs.adapter_check import check_one
from jobs.errors import AdapterRefusedError
from worker.engine.lora.adapter import load_adapter

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from tiny_adapters import make_adapter  # noqa: E402

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def base(make_checkpoint):
    ckpt = make_checkpoint("llama")
    return ckpt.model, json.loads((ckpt.path / "config.json").read_text()), ckpt.path


def _submit(name: str, folder: Path, config: dict, model: Path) -> object:
    return check_one(name, str(folder), str(model), config)


def _engine(name: str, folder: Path, config: dict, model: Path) -> object:
    return load_adapter(name, folder, config, [str(model)], torch.float32)


CHECKERS = {"submit": (_submit, AdapterRefusedError), "engine": (_engine, AdapterError)}


@pytest.fixture(params=sorted(CHECKERS))
def checker(request):
    return CHECKERS[request.param]


def _weights(folder: Path) -> Path:
    return folder / "adapter_model.safetensors"


def test_a_good_adapter_passes_both(base, tmp_path, checker) -> None:
    model, config, path = base
    folder = make_adapter(model, tmp_path / "good", rank=8, targets=("q_proj", "v_proj", "down_proj"))
    check, _ = checker
    layout = check("good", folder, config, path)
    layout = layout.layout if hasattr(layout, "layout") else layout
    assert {m.name.rsplit(".", 1)[1] for m in layout.modules} == {"q_proj", "v_proj", "down_proj"}
    assert len(layout.modules) == 3 * config["num_hidden_layers"]
    assert all(m.rank == 8 and m.scaling == 2.0 for m in layout.modules)


def _edit_config(folder: Path, **changes: object) -> None:
    cfg = json.loads((folder / "adapter_config.json").read_text())
    cfg.update(changes)
    (folder / "adapter_config.json").write_text(json.dumps(cfg))


def _case(name: str, model, tmp_path: Path, config: dict) -> tuple[Path, dict]:
    """(adapter folder, base config.json) of one bad case."""
    folder = tmp_path / name
    if name == "wide_base":  # the adapter is of this model; the base it is checked against is wider
        make_adapter(model, folder)
        return folder, {**config, "hidden_size": 96}
    if name == "deeper_adapter":  # an adapter of a deeper model: a layer the base does not have
        make_adapter(model, folder)
        tensors = load_file(_weights(folder))
        for key in [k for k in tensors if ".layers.1." in k]:
            tensors[key.replace(".layers.1.", ".layers.5.")] = tensors[key].clone()
        save_file(tensors, _weights(folder))
        return folder, config
    if name == "other_name":
        make_adapter(model, folder)
        _edit_config(folder, base_model_name_or_path="meta-llama/Llama-3.1-8B")
        return folder, config
    if name == "rank":
        make_adapter(model, folder, rank=MAX_LORA_RANK + 8, targets=("q_proj",))
        return folder, config
    if name == "lm_head":
        make_adapter(model, folder, targets=("q_proj", "lm_head"))
        return folder, config
    if name == "dora":
        make_adapter(model, folder, targets=("q_proj",), use_dora=True)
        return folder, config
    if name == "missing":
        make_adapter(model, folder, targets=("q_proj", "k_proj"))
        tensors = load_file(_weights(folder))
        del tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"]
        save_file(tensors, _weights(folder))
        return folder, config
    if name == "extra":
        make_adapter(model, folder, targets=("q_proj",))
        tensors = load_file(_weights(folder))
        tensors["base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight"] = torch.zeros(8, 64)
        save_file(tensors, _weights(folder))
        return folder, config
    if name == "bias":
        make_adapter(model, folder, targets=("q_proj",))
        tensors = load_file(_weights(folder))
        tensors["base_model.model.model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
        save_file(tensors, _weights(folder))
        return folder, config
    if name == "pickle":
        make_adapter(model, folder, targets=("q_proj",))
        _weights(folder).rename(folder / "adapter_model.bin")
        return folder, config
    if name == "no_config":
        make_adapter(model, folder, targets=("q_proj",))
        (folder / "adapter_config.json").unlink()
        return folder, config
    if name == "prefix_tuning":
        make_adapter(model, folder, targets=("q_proj",))
        _edit_config(folder, peft_type="PREFIX_TUNING")
        return folder, config
    raise AssertionError(name)


BAD = {
    "wide_base": "for another base",
    "deeper_adapter": "model.layers.5.mlp.down_proj, which the base model does not have",
    "other_name": "was trained on meta-llama/Llama-3.1-8B",
    "rank": f"over the largest rank freight serves ({MAX_LORA_RANK})",
    "lm_head": "targets lm_head",
    "dora": "sets use_dora=True",
    "missing": "missing weights of model.layers.1.self_attn.k_proj.lora_B",
    "extra": "extra weight base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight",
    "bias": "no LoRA A or B factor",
    "pickle": "no adapter_model.safetensors",
    "no_config": "no adapter_config.json",
    "prefix_tuning": "is a PREFIX_TUNING PEFT adapter",
}


@pytest.fixture(scope="module")
def bad_cases(base, tmp_path_factory):
    """Every bad case made once, checked by both checkers."""
    model, config, _ = base
    root = tmp_path_factory.mktemp("bad_adapters")
    return {case: _case(case, model, root, config) for case in BAD}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_adapters_are_refused_by_name(base, bad_cases, checker, case) -> None:
    folder, base_config = bad_cases[case]
    path = base[2]
    check, error = checker
    with pytest.raises(error) as info:
        check(f"cust-{case}", folder, base_config, path)
    message = str(info.value)
    assert f"adapter cust-{case}" in message
    assert BAD[case] in message, message
    assert "\n" not in message


def test_peft_matching_rules() -> None:
    cfg = LoraAdapterConfig.parse("a", {
        "peft_type": "LORA", "r": 8, "lora_alpha": 16, "use_rslora": True,
        "target_modules": ["q_proj", "down_proj"], "layers_to_transform": [1],
        "rank_pattern": {"down_proj": 4}, "alpha_pattern": {r"layers\.1\.self_attn\.q_proj": 32},
    })  # fmt: skip
    assert cfg.targets("model.layers.1.self_attn.q_proj")
    assert not cfg.targets("model.layers.0.self_attn.q_proj")  # layers_to_transform
    assert not cfg.targets("model.layers.1.self_attn.k_proj")
    assert cfg.rank_of("model.layers.1.mlp.down_proj") == 4
    assert cfg.scaling_of("model.layers.1.mlp.down_proj") == 16 / 2  # rslora: alpha / sqrt(4)
    assert cfg.scaling_of("model.layers.1.self_attn.q_proj") == pytest.approx(32 / 8**0.5)
    regex = LoraAdapterConfig.parse("b", {"peft_type": "LORA", "r": 4, "target_modules": r".*\.(q|v)_proj",
                                          "exclude_modules": ["layers.0.self_attn.v_proj"]})  # fmt: skip
    assert regex.targets("model.layers.3.self_attn.v_proj") and not regex.targets("model.layers.0.self_attn.v_proj")


def test_unchanged_adapter_files_copy(base, tmp_path) -> None:
    """A copied adapter folder is the same adapter (the checks read only its files)."""
    model, config, path = base
    folder = make_adapter(model, tmp_path / "a", targets=("o_proj",))
    shutil.copytree(folder, tmp_path / "b")
    assert check_one("b", str(tmp_path / "b"), str(path), config).modules
