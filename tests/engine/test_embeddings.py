"""Engine.embed against transformers' final hidden states pooled by hand, and sentence-transformers.

Checkpoints: tiny random transformers models (conftest's make_checkpoint) made embedding checkpoints
by writing sentence-transformers files into a copy (demo_model.add_pooling_config).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_oracle import hf_greedy, mixed_prompts

from worker.demo_model import add_pooling_config
from worker.engine import Engine, EngineConfig, SamplingParams
from worker.engine.loader import read_config
from worker.engine.models import ModelConfig

transformers = pytest.importorskip("transformers")

TEXTS = ["def add(a, b):", "import json\n\nclass Encoder(json.JSONEncoder):" * 6, "x", "for i in range(10):"]
# a small step budget: several forwards, and prompts longer than one forward run in chunks
SMALL = dict(kv_cache_bytes=8 << 20, max_num_batched_tokens=64, max_num_seqs=4)


def embedding_checkpoint(make_checkpoint, tmp_path: Path, arch: str, pooling: str, normalize: bool,
                         append_eos: bool = False, **overrides: object):  # fmt: skip
    ckpt = make_checkpoint(arch, **overrides)
    path = shutil.copytree(ckpt.path, tmp_path / f"{arch}-{pooling}")
    add_pooling_config(path, pooling, normalize=normalize, append_eos=append_eos)
    return path, ckpt.model


@torch.no_grad()
def hf_embedding(model: torch.nn.Module, ids: list[int], pooling: str, normalize: bool, dims: int | None = None):
    """transformers' last_hidden_state (after the final norm), pooled, truncated, normalized."""
    hidden = model.model(torch.tensor([ids])).last_hidden_state[0]  # [L, H]
    vec = {"lasttoken": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[pooling]
    vec = vec[:dims] if dims else vec
    return torch.nn.functional.normalize(vec, dim=0) if normalize else vec


CASES = [
    ("qwen3", "lasttoken", True),  # Qwen3-Embedding
    ("mistral", "lasttoken", True),  # e5-mistral
    ("llama", "mean", False),
    ("qwen2", "mean", True),
    ("llama", "cls", False),
    ("gemma3_text", "mean", True),  # two KV cache groups (kv_groups.py): the local layers' own pool
    ("gemma2", "lasttoken", False),
]


@pytest.mark.parametrize(("arch", "pooling", "normalize"), CASES)
def test_embeddings_equal_pooled_transformers_hidden_states(make_checkpoint, tmp_path, arch, pooling, normalize):
    path, model = embedding_checkpoint(make_checkpoint, tmp_path, arch, pooling, normalize)
    engine = Engine.from_pretrained(path, EngineConfig(**SMALL))
    prompts = mixed_prompts()  # lengths 1..300, shared prefixes, a duplicate
    dims = [None, 16, 7, None, 64, 1, None, 32, None, 3]
    outs = engine.embed(prompts, dimensions=dims)
    assert [o.index for o in outs] == list(range(len(prompts)))
    for out, ids, d in zip(outs, prompts, dims, strict=True):
        assert out.error is None and out.prompt_tokens == len(ids)
        assert out.embedding.dtype == np.float32 and out.embedding.shape == (d or 64,)
        want = hf_embedding(model, ids, pooling, normalize, d)
        np.testing.assert_allclose(out.embedding, want.numpy(), atol=1e-5, rtol=0)
        if normalize:
            assert np.linalg.norm(out.embedding) == pytest.approx(1.0, abs=1e-5)
    engine.block_manager.check_invariants([])
    bm = engine.block_manager
    for pool in (bm.full, bm.local) if arch.startswith("gemma") else (bm,):  # every block of each pool free
        assert pool.num_free_blocks == pool.num_blocks
    snap = engine.stats.snapshot()
    assert snap.prompt_tokens == snap.computed_prefill_tokens == sum(map(len, prompts))
    assert snap.decode_tokens == 0 and snap.decode_seconds == 0 and snap.prefill_seconds == snap.busy_seconds > 0


def test_text_prompts_keep_the_tokenizers_eos(make_checkpoint, tmp_path):
    """Qwen3-Embedding's tokenizer appends <|endoftext|> to each text; the engine embeds exactly what
    transformers' tokenizer gives, EOS included (its last token is the pooled one)."""
    path, model = embedding_checkpoint(make_checkpoint, tmp_path, "qwen3", "lasttoken", True, append_eos=True)
    engine = Engine.from_pretrained(path, EngineConfig(**SMALL))
    tok = transformers.AutoTokenizer.from_pretrained(path)
    outs = engine.embed(TEXTS, dimensions=24)
    for out, text in zip(outs, TEXTS, strict=True):
        ids = tok(text)["input_ids"]
        assert ids[-1] == tok.convert_tokens_to_ids("<|endoftext|>")
        assert out.prompt_tokens == len(ids)
        np.testing.assert_allclose(out.embedding, hf_embedding(model, ids, "lasttoken", True, 24), atol=1e-5)


@pytest.mark.parametrize(("arch", "pooling", "normalize", "dims"),
                         [("qwen3", "lasttoken", True, None), ("qwen3", "lasttoken", True, 20),
                          ("llama", "mean", False, 12)])  # fmt: skip
def test_embeddings_equal_sentence_transformers(make_checkpoint, tmp_path, arch, pooling, normalize, dims):
    """sentence-transformers' encode(truncate_dim=d, normalize_embeddings=<the Normalize module>): it
    truncates after its Normalize module, then normalizes again when asked, as OpenAI's dimensions."""
    st = pytest.importorskip("sentence_transformers")
    path, _ = embedding_checkpoint(make_checkpoint, tmp_path, arch, pooling, normalize, append_eos=True)
    engine = Engine.from_pretrained(path, EngineConfig(**SMALL))
    want = st.SentenceTransformer(str(path), device="cpu").encode(
        TEXTS, truncate_dim=dims, normalize_embeddings=normalize, convert_to_numpy=True
    )
    got = np.stack([o.embedding for o in engine.embed(TEXTS, dimensions=dims)])
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_a_batch_gives_the_vectors_of_one_at_a_time(make_checkpoint, tmp_path):
    path, _ = embedding_checkpoint(make_checkpoint, tmp_path, "llama", "mean", True)
    engine = Engine.from_pretrained(path, EngineConfig(**SMALL))
    prompts = mixed_prompts(seed=3)
    batch = engine.embed(prompts)
    alone = [engine.embed([p])[0] for p in prompts]
    for a, b in zip(batch, alone, strict=True):
        np.testing.assert_allclose(a.embedding, b.embedding, atol=1e-6, rtol=0)


def test_embed_keeps_no_kv_and_leaves_the_prefix_cache_sound(make_checkpoint, tmp_path):
    """Generation fills the prefix cache; embedding in a cache so small that it evicts those blocks
    leaves nothing behind (no block in use, no hash of its own); generation after it still matches
    transformers (hits only on blocks that hold what their hash says)."""
    path, model = embedding_checkpoint(make_checkpoint, tmp_path, "qwen3", "lasttoken", True)
    engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=1 << 20, max_num_batched_tokens=64,
                                                       max_num_seqs=4))  # fmt: skip
    bm = engine.block_manager
    prompts = mixed_prompts()[3:6]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    want = [hf_greedy(model, p, 4) for p in prompts]
    assert [o.token_ids for o in engine.generate(prompts, params)] == want
    cached_before = set(bm.hash_to_block)
    assert cached_before
    engine.embed([list(range(3, 300))] * 2 + mixed_prompts(seed=5))
    bm.check_invariants([])
    assert bm.num_free_blocks == bm.num_blocks and not bm.pending
    assert set(bm.hash_to_block) <= cached_before  # embedding added no cache entry (and may evict)
    assert [o.token_ids for o in engine.generate(prompts, params)] == want
    assert [o.token_ids for o in engine.generate(prompts, params)] == want  # now with prefix hits
    assert bm.prefix_hits > 0


def test_bad_prompts_and_dimensions_fail_alone(make_checkpoint, tmp_path):
    path, model = embedding_checkpoint(make_checkpoint, tmp_path, "llama", "lasttoken", True)
    engine = Engine.from_pretrained(path, EngineConfig(max_model_len=128, **SMALL))
    full = list(range(3, 131))  # exactly the context: fine (nothing is generated)
    prompts = [TEXTS[0], "", [5, 10**9], full + [7], full, TEXTS[2], TEXTS[3]]
    outs = engine.embed(prompts, dimensions=[None, None, None, None, None, 0, 65])
    errors = [o.error for o in outs]
    assert errors[0] is None and errors[4] is None
    assert "empty prompt" in errors[1] and "outside the vocabulary" in errors[2]
    assert "129 tokens" in errors[3] and "128" in errors[3]
    assert "bad dimensions 0" in errors[5] and "bad dimensions 65" in errors[6] and "[1, 64]" in errors[6]
    assert all(outs[i].embedding is None for i in (1, 2, 3, 5, 6))
    np.testing.assert_allclose(outs[4].embedding, hf_embedding(model, full, "lasttoken", True), atol=1e-5)
    with pytest.raises(ValueError, match="one each"):
        engine.embed(TEXTS, dimensions=[1, 2])
    with pytest.raises(ValueError, match="not one string"):
        engine.embed("one string")


def test_stopping_frees_the_blocks(make_checkpoint, tmp_path):
    path, _ = embedding_checkpoint(make_checkpoint, tmp_path, "llama", "mean", False)
    engine = Engine.from_pretrained(path, EngineConfig(**SMALL))
    seen: list = []
    for out in engine.embed_stream(mixed_prompts(), should_stop=lambda: len(seen) >= 2):
        seen.append(out)
    assert 2 <= len(seen) < len(mixed_prompts())
    engine.block_manager.check_invariants([])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


# KV budgets, in blocks of one shared pool, whose windowed pool gets what max_num_seqs=2 sequences need
# under a 32-token window and 32-token chunks (11 blocks, kv_pool_sizes): far fewer than a 900-token
# input spans (57). Gemma 2's global layers (1 : 1) need the larger budget to hold those 57.
WINDOWED = [
    ("gemma3_text", "mean", {"num_hidden_layers": 6, "layer_types": ["sliding_attention"] * 5 + ["full_attention"]},
     20),  # two groups: 11 local blocks, the global pool the rest
    ("mistral", "lasttoken", {"sliding_window": 32}, 20),  # one pool, every layer windowed: 11 blocks
    ("gemma2", "cls", {}, 40),
]


def _block_bytes(path: Path) -> int:
    """One fp32 16-token block's K and V over every layer."""
    cfg = ModelConfig.from_dict(read_config(path))
    return 2 * 16 * cfg.num_kv_heads * cfg.head_dim * 4 * cfg.num_layers


@pytest.mark.parametrize(("arch", "pooling", "overrides", "budget"), WINDOWED, ids=[w[0] for w in WINDOWED])
def test_long_inputs_hold_only_a_window_of_blocks(make_checkpoint, tmp_path, arch, pooling, overrides, budget):
    """Between chunks a long input gives back the blocks its window has left, as decode does, so it
    runs in a windowed pool smaller than its length, with transformers' embedding."""
    path, model = embedding_checkpoint(make_checkpoint, tmp_path, arch, pooling, True, **overrides)
    engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=budget * _block_bytes(path),
                                                       max_num_batched_tokens=32, max_num_seqs=2))  # fmt: skip
    bm = engine.block_manager
    pool = bm.local if hasattr(bm, "local") else bm  # the windowed one
    bound = pool.blocks_needed(10**6, 32)  # 5: 31 keys behind a 32-token chunk, and the chunk
    assert pool.window == 32 and pool.num_blocks == 2 * bound + 1 == 11
    peaks: list[int] = []
    forward = engine.runner.hidden_states

    def watched(*args, **kwargs):
        peaks.append(pool.num_blocks - pool.num_free_blocks)
        return forward(*args, **kwargs)

    engine.runner.hidden_states = watched
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 200, n).tolist() for n in (900, 20, 300, 7)]
    outs = engine.embed(prompts)
    for out, ids in zip(outs, prompts, strict=True):
        assert out.error is None, out.error
        np.testing.assert_allclose(out.embedding, hf_embedding(model, ids, pooling, True).numpy(), atol=1e-5, rtol=0)
    assert max(peaks) <= bound and len(peaks) > 900 // 32
    bm.check_invariants([])
    assert pool.num_free_blocks == pool.num_blocks


def test_an_input_the_cache_never_holds_fails_alone(make_checkpoint, tmp_path):
    path, model = embedding_checkpoint(make_checkpoint, tmp_path, "llama", "lasttoken", True)
    engine = Engine.from_pretrained(path, EngineConfig(kv_cache_bytes=10 * _block_bytes(path), max_num_batched_tokens=32))
    prompts = [list(range(3, 300)), list(range(3, 40))]
    outs = engine.embed(prompts)
    # the cache's 10 blocks of 16 tokens bound the context the engine serves
    assert "297 tokens but the context holds 160" in outs[0].error and outs[0].embedding is None
    np.testing.assert_allclose(outs[1].embedding, hf_embedding(model, prompts[1], "lasttoken", True), atol=1e-5)


def _write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_checkpoints_without_a_usable_pooling_config_refuse_embeddings(make_checkpoint, tmp_path):
    plain = make_checkpoint("llama").path
    engine = Engine.from_pretrained(plain, EngineConfig(kv_cache_bytes=4 << 20))
    with pytest.raises(ValueError, match=r"has no pooling config \(sentence-transformers modules.json / "
                                         r"1_Pooling/config.json\)"):  # fmt: skip
        engine.embed(TEXTS)
    assert engine.generate(TEXTS[:1], SamplingParams(max_tokens=2))[0].finish_reason == "length"  # still generates

    dense = shutil.copytree(plain, tmp_path / "dense")
    add_pooling_config(dense, "mean")
    modules = json.loads((dense / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    _write(dense / "modules.json", modules)
    with pytest.raises(ValueError, match="Dense"):
        Engine.from_pretrained(dense, EngineConfig(kv_cache_bytes=4 << 20)).embed(TEXTS)

    max_pool = shutil.copytree(plain, tmp_path / "max")
    add_pooling_config(max_pool, "mean")
    _write(max_pool / "1_Pooling/config.json", {"embedding_dimension": 64, "pooling_mode": "max"})
    with pytest.raises(ValueError, match=r"pooling modes \['max'\]"):
        Engine.from_pretrained(max_pool, EngineConfig(kv_cache_bytes=4 << 20)).embed(TEXTS)


def test_sentence_transformers_v6_config_is_read(make_checkpoint, tmp_path):
    """v6 writes `pooling_mode` / `embedding_dimension` and module paths under its new packages."""
    path, model = embedding_checkpoint(make_checkpoint, tmp_path, "qwen2", "cls", False)
    _write(path / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.base.modules.normalize.Normalize"},
    ])  # fmt: skip
    _write(path / "1_Pooling/config.json", {"embedding_dimension": 64, "pooling_mode": "lasttoken", "include_prompt": True})
    engine = Engine.from_pretrained(path, EngineConfig(**SMALL))
    assert (engine.pooling.mode, engine.pooling.normalize) == ("lasttoken", True)
    out = engine.embed([TEXTS[1]])[0]
    ids = engine.tokenizer.encode(TEXTS[1])
    np.testing.assert_allclose(out.embedding, hf_embedding(model, ids, "lasttoken", True), atol=1e-5)


def test_tokenizer_json_decides_special_tokens_as_in_transformers(make_checkpoint, tmp_path):
    """tokenizer.json's post-processor is the truth: transformers (5.x) drops tokenizer_config.json's
    add_bos_token / add_eos_token when tokenizer.json exists, and so does the engine; its ids equal
    AutoTokenizer's (no EOS appended here, one appended in test_text_prompts_keep_the_tokenizers_eos)."""
    path, model = embedding_checkpoint(make_checkpoint, tmp_path, "mistral", "lasttoken", True)
    config = json.loads((path / "tokenizer_config.json").read_text())
    _write(path / "tokenizer_config.json", {**config, "add_bos_token": True, "add_eos_token": True})
    tok = transformers.AutoTokenizer.from_pretrained(path)
    engine = Engine.from_pretrained(path, EngineConfig(**SMALL))
    for text, out in zip(TEXTS, engine.embed(TEXTS), strict=True):
        ids = tok(text)["input_ids"]
        assert engine.tokenizer.encode(text) == ids and out.prompt_tokens == len(ids)
        np.testing.assert_allclose(out.embedding, hf_embedding(model, ids, "lasttoken", True), atol=1e-5)
