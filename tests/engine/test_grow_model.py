"""bench/grow_model.py: a small Llama grown into a wider, deeper one computes the same logits, and
what the larger model adds still learns (its new parts receive gradients)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import grow_model  # noqa: E402
import train_reference  # noqa: E402


def _model(seed: int, **shape):
    cfg = train_reference.TrainConfig(vocab_size=96, context=32, batch_size=4, steps=60, warmup=5, **shape)
    torch.manual_seed(seed)
    return train_reference.build_model(cfg, eos_id=0).eval()


SMALL = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 48}
LARGE = {"hidden_size": 64, "num_layers": 3, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128}


def _no_eps(model) -> None:
    for module in model.modules():
        if hasattr(module, "variance_epsilon"):
            module.variance_epsilon = 0.0


def test_the_grown_model_computes_the_small_models_logits() -> None:
    small, large = _model(0, **SMALL), _model(1, **LARGE)
    for model in (small, large):
        _no_eps(model)  # RMSNorm's eps (1e-5) is the one thing growth cannot carry over exactly
    ids = torch.randint(0, 96, (3, 24), generator=torch.Generator().manual_seed(2))
    before = large(input_ids=ids).logits
    large.load_state_dict(grow_model.grow(small.state_dict(), large.state_dict(), head_dim=16))
    with torch.no_grad():
        want, got = small(input_ids=ids).logits, large(input_ids=ids).logits
    assert not torch.allclose(before, want, atol=1e-2)  # the fresh large model was another function
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
    assert grow_model.source_shape(small.state_dict(), 16) == {
        "hidden": 32, "layers": 2, "heads": 2, "kv_heads": 1, "intermediate": 48}  # fmt: skip


def test_the_new_parts_receive_gradients() -> None:
    small, large = _model(0, **SMALL), _model(1, **LARGE)
    large.load_state_dict(grow_model.grow(small.state_dict(), large.state_dict(), head_dim=16))
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(3))
    large.train()
    loss = torch.nn.functional.cross_entropy(large(input_ids=ids[:, :-1]).logits.flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    params = dict(large.named_parameters())
    o_new = params["model.layers.0.self_attn.o_proj.weight"].grad[:, 32:]  # the new heads' output columns
    down_extra = params["model.layers.2.mlp.down_proj.weight"].grad  # the appended identity layer's MLP
    embed_extra = params["model.embed_tokens.weight"].grad[:, 32:]  # the residual stream's new dimensions
    for grad in (o_new, down_extra, embed_extra):
        assert grad.abs().sum() > 0


def test_a_source_that_does_not_fit_is_refused() -> None:
    small, large = _model(0, **SMALL), _model(1, **LARGE)
    with pytest.raises(ValueError, match="larger than the target"):
        grow_model.grow(large.state_dict(), small.state_dict(), head_dim=16)
    other = _model(2, **{**LARGE, "num_kv_heads": 4})
    with pytest.raises(ValueError, match="per KV head"):
        grow_model.grow(small.state_dict(), other.state_dict(), head_dim=16)


def test_train_reference_grows_a_checkpoint_and_refuses_one_that_does_not_fit(tmp_path: Path) -> None:
    """`--grow-from DIR` (reference_checkpoint.grow_from) reads DIR/model.safetensors; a source that is
    larger than the run's shape exits with what was wrong instead of a traceback."""
    import reference_checkpoint
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models

    small, large = _model(0, **SMALL), _model(1, **LARGE)
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    reference_checkpoint.save_weights(small, tok, tmp_path, {"copy_warmup": {"steps": 3}})  # --save-warmup's writer
    assert (tmp_path / "tokenizer.json").is_file()  # a later --grow-from needs no --tokenizer-from
    assert json.loads((tmp_path / "training.json").read_text()) == {"copy_warmup": {"steps": 3}}
    assert reference_checkpoint.grow_from(tmp_path, large)["hidden"] == 32
    torch.testing.assert_close(large.state_dict()["model.layers.0.self_attn.o_proj.weight"][:32, :32],
                               small.state_dict()["model.layers.0.self_attn.o_proj.weight"])  # fmt: skip
    save_file({k: v.contiguous() for k, v in large.state_dict().items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(SystemExit, match="cannot grow it into this shape"):
        reference_checkpoint.grow_from(tmp_path, _model(2, **SMALL))
    with pytest.raises(SystemExit, match="do not match this shape"):
        reference_checkpoint.init_from(tmp_path, _model(2, **SMALL))
    # heads of another width would be read as another head count: refused by the source's config.json
    reference_checkpoint.save_weights(_model(3, **{**SMALL, "num_heads": 4, "num_kv_heads": 2}), tok, tmp_path, {})
    with pytest.raises(SystemExit, match="heads are 8 wide, this model's 16"):
        reference_checkpoint.grow_from(tmp_path, _model(4, **LARGE))
