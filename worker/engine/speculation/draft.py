"""DraftModel: a smaller checkpoint with the target's tokenizer proposes by greedy decoding.

It lives in the same engine with its own paged KV cache (its own ModelRunner and BlockManager, no
prefix cache) and the target's backend. Per speculating sequence it keeps the blocks of the tokens it
has computed (`_DraftSeq`). A proposal of k tokens: one forward over each sequence's tokens the
draft has not computed yet (a prompt the first time; after a verify step, the target's own token and
any accepted token the draft had not stored), whose last logits give d_1, then k - 1 decode steps;
all speculating sequences run batched. After verification the draft forgets the K/V past the
accepted tokens (`rollback`). On the CPU's C decode stack those forwards run through DraftStack
(draft_stack.py: no generic forward path around the small model's C work). Greedy proposals are
deterministic (q is one-hot), so the verifier's rule keeps the target's distribution exactly also
for sampled rows.

A folder with draft_vocab.json (FR-Spec, Zhao et al. 2025) proposes only the tokens it lists (the
corpus's most frequent; bench/draft_vocab.py): every drafting forward then reads those rows of the
lm_head, not the whole vocabulary's (the reference draft's head is over half its weights). A token
outside the list is never proposed, so a proposal ends before it; what the target outputs is the same.

Refused before any row runs (ValueError): a folder that does not load, another vocabulary size, a
tokenizer with another vocabulary or other EOS ids, a draft_vocab.json that is not a list of
distinct token ids of the vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import structlog
import torch

from worker.engine.backends.base import AttentionMetadata, Backend
from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig
from worker.engine.loader import load_model
from worker.engine.model_runner import ModelRunner
from worker.engine.sampler import to_device
from worker.engine.sequence import Sequence
from worker.engine.speculation.chain_stop import ChainStop
from worker.engine.speculation.draft_stack import DraftStack, top1
from worker.engine.tokenizer import Tokenizer

log = structlog.get_logger(__name__)

FAST_CATCH_UP = 16  # tokens per sequence up to which a catch-up runs as decode rows on the C stack
DRAFT_VOCAB = "draft_vocab.json"  # in the draft's folder: the tokens it may propose (frequent_tokens)
GoOn = Callable[[int, list[float]], bool]  # (sequence index, its tokens' probabilities) -> draft one more?


class _DraftSeq:
    """What the BlockManager reads of a sequence, for the draft's copy of one target sequence."""

    __slots__ = ("block_table", "block_hashes", "planned_hashes", "num_released", "computed", "seq")

    def __init__(self, seq: Sequence) -> None:
        self.block_table: list[int] = []
        self.num_released = 0  # the draft's manager has no window: it never releases blocks
        self.block_hashes: list[int] = []
        self.planned_hashes: list[int] = []
        self.computed = 0  # positions [0, computed) have the draft's K/V
        self.seq = seq


class DraftModel:
    def __init__(self, path: str, config: EngineConfig, backend: Backend, tokenizer: Tokenizer, vocab_size: int,
                 max_model_len: int) -> None:  # fmt: skip
        folder = Path(path)
        try:
            draft_tok = Tokenizer(folder)
            model = load_model(folder, dataclasses.replace(config, quantization=None), backend, max_model_len)
        except Exception as exc:  # noqa: BLE001 (any failure to load is the same user error)
            raise ValueError(f"the draft model {path} does not load ({type(exc).__name__}: {exc}); "
                             "pass a Hugging Face checkpoint folder with config.json, safetensors and "
                             "tokenizer.json") from None  # fmt: skip
        if model.cfg.vocab_size != vocab_size:
            raise ValueError(f"the draft model {path} has a vocabulary of {model.cfg.vocab_size} tokens, the "
                             f"model {vocab_size}; a draft must share the model's tokenizer")  # fmt: skip
        if draft_tok.vocab() != tokenizer.vocab() or set(draft_tok.eos_token_ids) != set(tokenizer.eos_token_ids):
            raise ValueError(f"the draft model {path} has another tokenizer than the model (vocabulary or EOS "
                             "ids differ); a draft must share the model's tokenizer")  # fmt: skip
        self.block_size = config.block_size
        cfg = model.cfg
        per_block = ModelRunner.kv_bytes_per_block(model, config.block_size, config.torch_dtype)
        want = config.max_num_seqs * -(-max_model_len // config.block_size) + 1  # every row at full length
        budget = (config.kv_cache_bytes or 1 << 30) // 4  # at most a quarter of the target's budget
        num_blocks = max(1, min(want, budget // per_block))
        self.runner = ModelRunner(model, num_blocks, config.block_size, config.torch_device, config.torch_dtype,
                                  config.decode_stack)  # fmt: skip
        self.bm = BlockManager(num_blocks, config.block_size, enable_prefix_caching=False)
        # the draft's steps straight on the C decode stack where the backend bound it (CPU), else None
        self.head_ids = frequent_tokens(folder, vocab_size)  # FR-Spec: the tokens it may propose (None: all)
        self.fast = DraftStack(model, config.block_size, self.head_ids) if DraftStack.usable(model) else None
        self.kv_bytes = num_blocks * per_block  # taken out of the target's KV budget
        self.device = config.torch_device
        self.states: dict[int, _DraftSeq] = {}  # target seq_id -> the draft's copy
        self.prefilled = False  # the latest propose ran a prompt-sized catch-up (not a steady step's cost)
        log.info("draft_model_ready", path=path, layers=cfg.num_layers, hidden=cfg.hidden_size, num_blocks=num_blocks)

    # ---- proposing ------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], ks: list[int], go_on: GoOn | None = None, with_probs: bool = False
                ) -> tuple[list[list[int]], list[list[float]]]:  # fmt: skip
        """Greedy proposals of up to ks[i] tokens for seqs[i] ([] where the draft's cache has no room)
        and, with `with_probs` or an early stop, the draft's probability of each token. go_on(i,
        probabilities so far) says whether seqs[i] drafts another token (None: all ks[i])."""
        self._forget_finished()
        self.prefilled = False
        live, ends = [], []
        for i, seq in enumerate(seqs):
            st = self.states.get(seq.seq_id)
            if st is None:
                st = self.states[seq.seq_id] = _DraftSeq(seq)
            n = len(seq.token_ids)
            if self.bm.append_slots(st, n + ks[i] - 1):  # type: ignore[arg-type]
                live.append(i)
                ends.append(n)
        out: list[list[int]] = [[] for _ in seqs]
        want = with_probs or go_on is not None
        probs: list[list[float]] = [[] for _ in seqs]
        if not live:
            return out, probs
        states = [self.states[seqs[i].seq_id] for i in live]
        short = None if self.fast is None else self._short_catch_up(states, ends)  # decode rows, or a prefill
        if self._chained(states, ends, short, [ks[i] for i in live], go_on, live, out, probs if want else None):
            return out, probs
        rows = list(range(len(live)))
        tokens, top = self._catch_up(states, ends, short, want)
        for j in range(1, max(ks[i] for i in live) + 1):
            for r, t in zip(rows, tokens.tolist(), strict=True):
                out[live[r]].append(t)
            if top is not None:
                for r, q in zip(rows, top.tolist(), strict=True):
                    probs[live[r]].append(q)
            rows = [r for r in rows if ks[live[r]] > j and (go_on is None or go_on(live[r], probs[live[r]]))]
            if not rows:
                break
            tokens, top = self._decode([states[r] for r in rows], [ends[r] - 1 + j for r in rows],
                                       [out[live[r]][-1] for r in rows], want)  # fmt: skip
        for r, i in enumerate(live):
            states[r].computed = ends[r] + len(out[i]) - 1
        return out, probs

    def _chained(self, states: list[_DraftSeq], ends: list[int], los: list[int] | None, ks: list[int],
                 go_on: GoOn | None, live: list[int], out: list[list[int]], probs: list[list[float]] | None
                 ) -> bool:  # fmt: skip
        """The whole proposal in one C call (DraftStack.chain) where the draft runs on the C stack and
        every catch-up is short (`los`: _short_catch_up's): out[live[r]] (and probs[live[r]]) filled,
        True; else False."""
        if self.fast is None or los is None:
            return False
        if not self.fast.chain.takes(sum(e - lo for lo, e in zip(los, ends, strict=True))):
            return False
        if not self.fast.chain.takes(len(states)) or (go_on is not None and not isinstance(go_on, ChainStop)):
            return False
        ids, pos, table, counts = self._rows(states, los, ends, ks)
        stop = None if go_on is None else dataclasses.replace(go_on, values=tuple(go_on.values[i] for i in live)).arrays()
        tokens, top, made = self.fast.chain.propose(ids, pos, np.repeat(table, counts, axis=0), np.cumsum(counts) - 1,
                                                    np.asarray(ks), stop)  # fmt: skip
        for r, i in enumerate(live):
            n = int(made[r])
            out[i] = tokens[r, :n].tolist()
            if probs is not None:
                probs[i] = top[r, :n].tolist()
            states[r].computed = ends[r] + n - 1
        return True

    def in_step(self, seq: Sequence) -> bool:
        """The draft has computed seq up to a short catch-up (it drafted for it lately)."""
        st = self.states.get(seq.seq_id)
        return st is not None and len(seq.token_ids) - st.computed <= FAST_CATCH_UP

    def rollback(self, seq: Sequence, accepted: int) -> None:
        """seq (still holding the tokens before its verify run) kept `accepted` proposals: the draft's
        K/V of the rejected ones is forgotten (recomputed by the next catch-up if ever needed)."""
        st = self.states.get(seq.seq_id)
        if st is not None:
            st.computed = min(st.computed, len(seq.token_ids) + accepted)

    def _forget_finished(self) -> None:
        for seq_id in [i for i, st in self.states.items() if st.seq.is_finished]:
            self.bm.free(self.states.pop(seq_id))  # type: ignore[arg-type]

    # ---- forwards -------------------------------------------------------------------------
    def _slots(self, st: _DraftSeq, positions: range | list[int]) -> list[int]:
        bs = self.block_size
        return [st.block_table[p // bs] * bs + p % bs for p in positions]

    def _tables_np(self, states: list[_DraftSeq], width: int) -> np.ndarray:
        out = np.zeros((len(states), width), np.int32)
        for r, st in enumerate(states):
            out[r, : min(width, len(st.block_table))] = st.block_table[:width]
        return out

    def _tables(self, states: list[_DraftSeq], width: int) -> torch.Tensor:
        return to_device(self._tables_np(states, width), self.device)

    def _short_catch_up(self, states: list[_DraftSeq], ends: list[int]) -> list[int] | None:
        """Where each sequence's catch-up starts (its tokens [lo, end) the draft has not computed; the
        newest always runs) when every one is short enough to run as decode rows (FAST_CATCH_UP) and
        none rotates a long prompt's own tokens (LongRoPE: the prefill path); else None."""
        los = [min(st.computed, end - 1) for st, end in zip(states, ends, strict=True)]
        if max(e - lo for lo, e in zip(los, ends, strict=True)) > FAST_CATCH_UP:
            return None
        rope = self.runner.model.rope_offset
        if any(rope(st.seq.num_prompt_tokens) and lo < st.seq.num_prompt_tokens for lo, st in zip(los, states, strict=True)):
            return None
        return los

    def _rows(self, states: list[_DraftSeq], los: list[int], ends: list[int], ks: list[int] | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
        """A short catch-up's decode rows: ids and positions int64 [R], the sequences' block tables int32
        [S, W] (covering the ks[s] - 1 tokens after the catch-up too) and each sequence's row count [S]."""
        more = ks or [1] * len(ends)
        table = self._tables_np(states, max(-(-(e + k - 1) // self.block_size) for e, k in zip(ends, more, strict=True)))
        counts = np.asarray([e - lo for lo, e in zip(los, ends, strict=True)])
        pos = np.concatenate([np.arange(lo, e, dtype=np.int64) for lo, e in zip(los, ends, strict=True)])
        ids = np.asarray([t for st, lo, e in zip(states, los, ends, strict=True) for t in st.seq.token_ids[lo:e]],
                         np.int64)  # fmt: skip
        return ids, pos, table, counts

    def _catch_up(self, states: list[_DraftSeq], ends: list[int], short: list[int] | None, probs: bool
                  ) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
        """One forward over each sequence's uncomputed tokens [computed, end); the greedy next token.
        Short catch-ups (after a verify step: the target's own token, maybe an accepted one) run as
        decode-shaped rows on the C stack where there is one (DraftStack; `short`: _short_catch_up's starts, None
        where it found none or there is no stack); else one prefill."""
        if short is not None and self.fast.takes(sum(e - lo for lo, e in zip(short, ends, strict=True))):  # type: ignore[union-attr]
            ids, pos, table, counts = self._rows(states, short, ends)
            return self.fast.greedy(ids, pos, np.repeat(table, counts, axis=0), np.cumsum(counts) - 1, probs)  # type: ignore[union-attr]
        los = [min(st.computed, end - 1) for st, end in zip(states, ends, strict=True)]
        offsets = [self.runner.model.rope_offset(st.seq.num_prompt_tokens) for st in states]  # LongRoPE drafts
        self.prefilled = max(e - lo for lo, e in zip(los, ends, strict=True)) > FAST_CATCH_UP
        ids, pos, slots, cu, last = [], [], [], [0], []
        for st, end, lo, off in zip(states, ends, los, offsets, strict=True):
            ids += st.seq.token_ids[lo:end]
            pos += range(lo + off, end + off)  # a LongRoPE draft's rotary rows (CausalLM.rope_offset)
            slots += self._slots(st, range(lo, end))
            cu.append(len(ids))
            last.append(len(ids) - 1)
        dev, bs = self.device, self.block_size
        width = max(-(-e // bs) for e in ends)
        tables = self._tables(states, width)
        lens = to_device(np.asarray(ends, np.int32), dev)
        meta = AttentionMetadata(
            slot_mapping=to_device(np.asarray(slots, np.int64), dev), num_prefill_tokens=len(ids),
            prefill_cu_seqlens_q=to_device(np.asarray(cu, np.int32), dev), prefill_context_lens=lens,
            prefill_block_tables=tables, output_rows=to_device(np.asarray(last, np.int64), dev),
            output_context_lens=lens, output_block_tables=tables,
        )  # fmt: skip
        return self._greedy(to_device(np.asarray(ids, np.int64), dev), to_device(np.asarray(pos, np.int64), dev), meta,
                            probs)  # fmt: skip

    def _decode(self, states: list[_DraftSeq], positions: list[int], ids: list[int], probs: bool
                ) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
        dev, bs = self.device, self.block_size
        if self.fast is not None and self.fast.takes(len(states)):
            table = self._tables_np(states, max(positions) // bs + 1)
            return self.fast.greedy(np.asarray(ids, np.int64), np.asarray(positions, np.int64), table, None, probs)
        slots = [self._slots(st, [p])[0] for st, p in zip(states, positions, strict=True)]
        meta = AttentionMetadata(
            slot_mapping=to_device(np.asarray(slots, np.int64), dev), num_prefill_tokens=0,
            decode_context_lens=to_device(np.asarray(positions, np.int32) + 1, dev),
            decode_block_tables=self._tables(states, max(positions) // bs + 1),
        )  # fmt: skip
        return self._greedy(to_device(np.asarray(ids, np.int64), dev), to_device(np.asarray(positions, np.int64), dev),
                            meta, probs)  # fmt: skip

    def _greedy(self, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, probs: bool
                ) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
        hidden = self.runner.hidden_states(ids, positions, meta)
        logits = self.runner.model.compute_logits(hidden).float().cpu()
        if self.head_ids is None:
            return top1(logits, probs)
        token, prob = top1(logits[:, torch.from_numpy(self.head_ids)].contiguous(), probs)
        return self.head_ids[token], prob


def frequent_tokens(folder: Path, vocab_size: int) -> np.ndarray | None:
    """The token ids of the draft folder's draft_vocab.json ({"token_ids": [...]}: the tokens the draft
    may propose, FR-Spec's frequency-ranked subset; bench/draft_vocab.py writes it), sorted; None
    without the file. Raises ValueError for a file that is not such a list."""
    path = folder / DRAFT_VOCAB
    if not path.is_file():
        return None
    try:
        ids = json.loads(path.read_text())["token_ids"]
        ok = isinstance(ids, list) and ids and all(type(t) is int and 0 <= t < vocab_size for t in ids)
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok or len(set(ids)) != len(ids):
        raise ValueError(f"{path} must hold {{\"token_ids\": [...]}}: distinct token ids below the vocabulary "
                         f"size {vocab_size}; fix or delete it (without it the draft proposes any token)")  # fmt: skip
    return np.asarray(sorted(ids), np.int64)
