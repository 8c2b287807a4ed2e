"""Loading the common GPTQ 4-bit format: packed by this test the way that format packs, then converted."""

from __future__ import annotations

import pytest
import torch
from gptq_packing import make_gptq_layer, words

from worker.engine.quant import prepare_quantized_model
from worker.engine.quant.gptq_format import GPTQInt4Linear, gptq_to_freight


@pytest.mark.parametrize("v2", [False, True])
def test_converted_weights_equal_the_dequantized_originals(v2: bool) -> None:
    layer = make_gptq_layer(64, 256, 128, v2=v2)
    qweight, scales = gptq_to_freight(layer["qweight"], layer["qzeros"], layer["scales"], layer["g_idx"], 128,
                                      "gptq_v2" if v2 else "gptq")
    from worker.engine.quant.formats import dequantize_int4

    assert qweight.shape == (64, 128) and scales.shape == (64, 2)
    torch.testing.assert_close(dequantize_int4(qweight, scales, 128), layer["weight"], rtol=0, atol=0)


def test_swapped_module_loads_gptq_tensors_by_name_and_computes() -> None:
    model = torch.nn.Sequential()
    model.add_module("proj", torch.nn.Linear(256, 64, bias=False))
    model.add_module("lm_head", torch.nn.Linear(64, 32, bias=False))
    prepare_quantized_model(model, {"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": True,
                                    "desc_act": False})
    assert isinstance(model.proj, GPTQInt4Linear) and isinstance(model.lm_head, torch.nn.Linear)
    layer = make_gptq_layer(64, 256, 64, seed=3)
    weight = layer.pop("weight")
    model.proj.load_state_dict(layer)
    x = torch.randn(4, 256)
    model.proj.cpu_path = "weight_only"
    torch.testing.assert_close(model.proj(x), x @ weight.T, rtol=1e-5, atol=1e-5)
    assert model.proj.converted and set(dict(model.proj.state_dict())) == {"qweight", "scales"}
    with_head = torch.nn.Sequential()
    with_head.add_module("lm_head", torch.nn.Linear(256, 64, bias=False))
    prepare_quantized_model(with_head, {"quant_method": "gptq", "bits": 4, "group_size": 64, "sym": True,
                                        "desc_act": False, "lm_head": True})  # GPTQModel's quantized head
    assert isinstance(with_head.lm_head, GPTQInt4Linear)


def test_unsupported_gptq_checkpoints_are_refused() -> None:
    layer = make_gptq_layer(16, 128, 32)
    shuffled = layer["g_idx"][torch.randperm(128)]
    with pytest.raises(ValueError, match="desc_act"):
        gptq_to_freight(layer["qweight"], layer["qzeros"], layer["scales"], shuffled, 32)
    asym = words(torch.full((4, 2, 8), 2))  # zero 3: values reach 15 - 3 = 12 > 7
    with pytest.raises(ValueError, match="symmetric"):
        gptq_to_freight(layer["qweight"], asym, layer["scales"], layer["g_idx"], 32)
    model = torch.nn.Sequential(torch.nn.Linear(128, 16))
    for cfg, match in (({"quant_method": "gptq", "bits": 4, "sym": False}, "asymmetric"),
                       ({"quant_method": "gptq", "bits": 4, "desc_act": True}, "desc_act"),
                       ({"quant_method": "gptq", "bits": 3}, "3 bits"),
                       ({"quant_method": "awq", "bits": 4}, "not supported")):
        with pytest.raises(ValueError, match=match):
            prepare_quantized_model(model, cfg)
    assert isinstance(model[0], torch.nn.Linear)  # nothing swapped
