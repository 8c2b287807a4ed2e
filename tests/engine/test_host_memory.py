"""worker.engine.host_memory: huge-page tensors and the packed weight arena."""

from __future__ import annotations

import mmap

import pytest
import torch
from torch import nn

from worker.engine.host_memory import HUGE_PAGE, huge_page_empty, huge_page_zeros, pack_parameters


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no transparent huge pages on this platform")
def test_big_tensors_start_on_a_huge_page() -> None:
    t = huge_page_zeros((3, HUGE_PAGE // 4 + 5), torch.float32)
    assert t.data_ptr() % HUGE_PAGE == 0 and t.shape == (3, HUGE_PAGE // 4 + 5)
    assert not t.any()
    t[-1, -1] = 7.0  # the whole extent is writable
    assert float(t.sum()) == 7.0
    small = huge_page_empty(100, torch.float32)  # under a huge page: ordinary memory
    assert small.numel() == 100


def test_pack_keeps_values_ties_and_objects() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 24), nn.Linear(24, 7), nn.LayerNorm(7), nn.Linear(7, 50, bias=False))
    tied = nn.Linear(24, 50, bias=False)  # an lm_head tied to the embeddings
    tied.weight = model[0].weight
    model.append(tied)
    model.register_buffer("steps", torch.arange(5))  # not a parameter: stays where it is
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    params = list(model.parameters())
    steps_ptr = model.steps.data_ptr()
    total = pack_parameters(model)
    assert list(model.parameters()) == params  # the same Parameter objects
    assert tied.weight is model[0].weight
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    ptrs = [p.data_ptr() for p in params]
    assert ptrs == sorted(ptrs) and all(ptr % 64 == 0 for ptr in ptrs)
    assert total >= sum(p.numel() * 4 for p in params) and model.steps.data_ptr() == steps_ptr
    with torch.no_grad():
        model[0].weight[0, 0] = 123.0  # tied weights still share memory after the move
    assert tied.weight[0, 0] == 123.0
