"""An embed_stream read in part, with generation on the same engine in between, and abandoned.

The embedder and the scheduler share the engine's block manager. A paused embed_stream holds no KV
block (embedder.py frees a forward's blocks before yielding its outputs), so a generate runs to its
end meanwhile, even one that needs the whole cache; a forward due while a generate stream is
unfinished is refused with a message, and an abandoned stream leaves every block free.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from engine_oracle import hf_greedy, mixed_prompts
from test_embeddings import _block_bytes, embedding_checkpoint

from worker.engine import Engine, EngineConfig, SamplingParams

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def _engine(make_checkpoint, tmp_path, arch: str = "llama", blocks: int = 12, **overrides: object):
    path, model = embedding_checkpoint(make_checkpoint, tmp_path, arch, "mean", False, **overrides)
    config = EngineConfig(kv_cache_bytes=blocks * _block_bytes(path), max_num_batched_tokens=64, max_num_seqs=4)
    return Engine.from_pretrained(path, config), model


def _all_free(engine: Engine) -> None:
    bm = engine.block_manager
    bm.check_invariants([])
    for pool in (bm.full, bm.local) if hasattr(bm, "local") else (bm,):
        assert pool.num_free_blocks == pool.num_blocks


def test_a_generate_runs_while_an_embed_stream_is_paused(make_checkpoint, tmp_path):
    """The generate needs 10 of the 12 blocks; the paused stream's first forward held 4 (before the
    fix the scheduler waited for them forever). Both give what they give alone."""
    engine, model = _engine(make_checkpoint, tmp_path)
    prompts = mixed_prompts()[:4] + mixed_prompts(seed=1)[:4]
    want = engine.embed(prompts)
    long = list(range(3, 150))
    stream = engine.embed_stream(prompts)
    got = [next(stream)]
    _all_free(engine)
    assert [o.token_ids for o in engine.generate([long], PARAMS)] == [hf_greedy(model, long, 4)]
    got += list(stream)
    assert [o.index for o in got] == [o.index for o in sorted(got, key=lambda o: o.index)]
    for a, b in zip(sorted(got, key=lambda o: o.index), want, strict=True):
        np.testing.assert_array_equal(a.embedding, b.embedding)
    _all_free(engine)


def test_an_embed_forward_is_refused_while_a_generate_stream_is_unfinished(make_checkpoint, tmp_path):
    engine, model = _engine(make_checkpoint, tmp_path)
    prompts = mixed_prompts()[:4] + mixed_prompts(seed=1)[:4]
    embeds = engine.embed_stream(prompts)
    next(embeds)
    gen = engine.stream([list(range(3, 40)), list(range(3, 90))], PARAMS)
    next(gen)
    with pytest.raises(RuntimeError, match="generate stream .* unfinished; finish or close that stream"):
        list(embeds)
    with pytest.raises(RuntimeError, match="running a generate stream; finish or close it first"):
        engine.embed(prompts)
    assert [o.error for o in gen] == [None]  # the generate stream was not disturbed
    gen.close()
    _all_free(engine)
    assert all(o.error is None for o in engine.embed(prompts))


@pytest.mark.parametrize("arch", ["llama", "gemma3_text"])  # one pool; two KV cache groups
@pytest.mark.parametrize("how", ["close", "collect"])
def test_an_abandoned_embed_stream_gives_back_its_blocks(make_checkpoint, tmp_path, arch, how):
    engine, model = _engine(make_checkpoint, tmp_path, arch, blocks=40)
    stream = engine.embed_stream([list(range(3, 300)), *mixed_prompts()[:6]])  # the long one in chunks
    next(stream)
    next(stream)
    if how == "close":
        stream.close()
    else:
        del stream
        gc.collect()
    _all_free(engine)
    prompt = mixed_prompts()[3]
    assert [o.token_ids for o in engine.generate([prompt], PARAMS)] == [hf_greedy(model, prompt, 4)]
