"""ModelRunner: owns the model, the KV cache and the device copies of the batch; runs a step's
device phases, each called by Engine.step (engine.py), inside its inference mode:

- launch(): inputs (step_inputs) and the forward (through the decode graphs for a pure-decode step
  when they are on), not waited on; what the later phases read of the batch is read here
  (LaunchedStep), before the engine applies the previous step's tokens, which may finish rows.
- sample(): sampling and stop checks on the device, the sampled ids written into the device's
  last-token rows (the next decode step reads them there), and one device-to-host copy of the
  sampled ids with their stop flags. The returned InFlightStep is waited on only when its tokens are
  applied, so on CUDA the host can schedule the next step meanwhile.
- verify(): speculation's verify runs (speculation/verifier.py).

Between launch and sample the engine masks the masked rows' logits in place (structured outputs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from worker.engine.backends.base import AttentionMetadata
from worker.engine.batch_state import PersistentBatch
from worker.engine.decode_graphs import DecodeGraphs
from worker.engine.device_rows import DeviceRows
from worker.engine.host_memory import huge_page_zeros
from worker.engine.kv_groups import kv_groups
from worker.engine.logits_processing import LogitsProcessing
from worker.engine.lora.token_slots import step_slots
from worker.engine.models import CausalLM
from worker.engine.sampler import Sampler, SamplingRows, stop_hits, to_device
from worker.engine.scheduler_output import SchedulerOutput
from worker.engine.sequence import Sequence
from worker.engine.speculation.verifier import SpecRun, Verifier
from worker.engine.step_inputs import PromptScores, StepInputs, build_step
from worker.engine.structured_outputs import RunCut


@dataclass(slots=True, kw_only=True)
class InFlightStep:
    """A launched step's results, on the host once `results()` returns."""

    rows: np.ndarray  # int64 [S]: batch row of each sampled token
    seq_ids: np.ndarray  # int64 [S]: the sequence in that row at launch
    version: int  # the batch's membership version at launch (unchanged: every row still holds it)
    ascending: bool  # rows ascending (a decode-only step)
    packed: torch.Tensor  # int64 [S] on the host (once ready): token id | stop hit << 32
    ready: torch.cuda.Event | None
    logprobs: tuple[np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor] | None  # (indices, values, ids, sampled)
    prompt: list[tuple[PromptScores, torch.Tensor]]  # prompt logprobs per scored chunk, on the host
    tokens: np.ndarray | None = None  # int64 [S], set at once when the host computed them
    hits: np.ndarray | None = None  # bool [S]: the token is a stop token of its row
    spec: list[SpecRun] | None = None  # speculation: the verified rows' kept tokens (not in `rows`)

    def results(self) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, stop hits), waiting for the device's copy if needed."""
        if self.tokens is None:
            if self.ready is not None:
                self.ready.synchronize()
            packed = self.packed.numpy()
            self.tokens, self.hits = packed & 0xFFFFFFFF, (packed >> 32) != 0
        return self.tokens, self.hits  # type: ignore[return-value]


@dataclass(slots=True, kw_only=True)
class LaunchedStep:
    """A step whose forward is launched (its logits maybe not computed yet): what its later phases
    read. Everything of the batch here is read at launch, before the previous step's tokens are
    applied (those may finish rows and free them)."""

    inputs: StepInputs
    logits: torch.Tensor  # fp32 [N, V]: the plain logits rows (prompt-logprob rows, then the sampled ones)
    sampled: torch.Tensor  # fp32 [S, V]: the sampled rows' logits, the last S rows of `logits`
    raw: torch.Tensor  # `sampled` before the masks: a copy when a masked step's sampled rows want logprobs
    seq_ids: np.ndarray  # int64 [S]: the sequence in each sampled row
    version: int  # the batch's membership version
    drawing: bool  # a sampled row draws (temperature > 0)
    processing: bool  # a sampled row's logits are processed (penalties, logit_bias, min_tokens)
    # speculation's verify runs (inputs.spec; None without): their logits rows, 1 + K each, and those
    # before the masks (a copy when a masked run wants logprobs)
    verified: torch.Tensor | None = None  # fp32 [M, V]
    raw_verified: torch.Tensor | None = None
    # the masked sampled rows (a constraint or a thinking budget; None: none), as rows of `sampled`,
    # and their sequences
    masked: np.ndarray | None = None  # int64
    masked_seqs: list[Sequence] | None = None
    # the masked verify runs (None: none): index in inputs.spec -> (first row in `verified`, sequence,
    # proposed tokens)
    masked_runs: dict[int, tuple[int, Sequence, tuple[int, ...]]] | None = None


_NO_TOKENS = torch.zeros(0, dtype=torch.int64)  # InFlightStep.packed when the host has the tokens already


def _to_host(t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "cpu":
        return t
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return out.copy_(t, non_blocking=True)


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype, decode_stack: bool = True, num_local_blocks: int | None = None) -> None:  # fmt: skip
        """num_local_blocks: the model's local layers get caches of that many blocks, a pool of their
        own (two KV cache groups: kv_groups.py); None: every layer's cache has num_blocks."""
        cfg = model.cfg
        self.model = model
        self.device = device
        self.block_size = block_size
        model.kv_grouped = num_local_blocks is not None
        self.num_blocks, self.num_local_blocks = num_blocks, num_local_blocks

        def zeros(blocks: int) -> torch.Tensor:  # on the CPU on huge pages: attention reads scattered blocks
            shape = (blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
            if device.type == "cpu":
                return huge_page_zeros(shape, dtype)
            return torch.zeros(shape, dtype=dtype, device=device)

        self.groups = kv_groups(num_local_blocks is not None)
        layer_group = [cfg.kv_group(i) if model.kv_grouped else 0 for i in range(cfg.num_layers)]
        pool = (num_blocks, num_local_blocks)
        # zeros, not empty: padded reads of never-written slots must stay finite (masked to 0 weight).
        self.kv_caches = [(zeros(pool[g]), zeros(pool[g])) for g in layer_group]  # type: ignore[arg-type]
        # each group's layers' caches (copy-on-write copies a block in every layer of its group)
        self.group_caches = [[kv for kv, g in zip(self.kv_caches, layer_group, strict=True) if g == group.index]
                             for group in self.groups]  # fmt: skip
        model.decode_stack = model.backend.decode_stack(model, self.kv_caches) if decode_stack else None
        self.sampler = Sampler()
        self.rows: DeviceRows | None = None
        self.graphs: DecodeGraphs | None = None

    @staticmethod
    def kv_bytes_per_block(model: CausalLM, block_size: int, dtype: torch.dtype) -> int:
        cfg = model.cfg
        return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize

    def bind(self, batch: PersistentBatch, mirror: bool, static_decode: bool) -> None:
        """Attach the engine's persistent batch: device copies of its rows (mirror: separate tensors,
        else views of the host arrays) and, with static_decode, the padded decode buffers."""
        self.batch = batch
        self.rows = DeviceRows(batch, self.device, copy=mirror)
        self.processing = LogitsProcessing(batch, self.rows, self.model.cfg.vocab_size)
        self.verifier = Verifier(batch, self.rows, self.processing, self.sampler)
        if static_decode:
            self.graphs = DecodeGraphs(self.model, self.kv_caches, batch.max_rows, batch.block_table.shape[1],
                                       self.device)  # fmt: skip

    def launch(self, sched: SchedulerOutput) -> LaunchedStep:
        """Build the step's inputs and launch its forward; the batch's rows are read now (LaunchedStep)."""
        rows, b = self.rows, self.batch
        rows.sync()
        if sched.copies:
            self._copy_blocks(sched.copies)
        inputs = build_step(sched, b, rows)
        if self.model.lora is not None:  # the adapters' products of the wrapped projections (lora/)
            self.model.lora.set(step_slots(sched, b), inputs.meta.output_rows)
        logits = self._logits(inputs)
        verified = None
        if inputs.num_spec_logits:  # verify rows come last (step_inputs)
            plain = logits.shape[0] - inputs.num_spec_logits
            verified, logits = logits[plain:], logits[:plain]
        sample_rows = inputs.sample_rows
        # a decode step samples every row: no slice (a torch call per step saved)
        sampled = logits if logits.shape[0] == sample_rows.size else logits[logits.shape[0] - sample_rows.size :]
        step = LaunchedStep(
            inputs=inputs, logits=logits, sampled=sampled, raw=sampled, seq_ids=b.seq_id[sample_rows],
            version=b.version, drawing=bool(b.num_drawing and b.temperature[sample_rows].any()),
            processing=bool(b.num_processed and b.processed[sample_rows].any()),
        )  # fmt: skip
        if verified is not None:
            step.verified = step.raw_verified = verified
        if b.num_constrained:
            self._read_masks(step)
        return step

    def _read_masks(self, step: LaunchedStep) -> None:
        """LaunchedStep's masked rows and runs, and the raw copies of their logits where a row of them
        wants logprobs (logprobs are of the raw distribution, before the masks)."""
        b, inputs = self.batch, step.inputs
        sample_rows = inputs.sample_rows
        masked = np.flatnonzero(b.constrained[sample_rows])
        if masked.size:
            step.masked, step.masked_seqs = masked, b.sequences(sample_rows[masked])
            if b.num_special and (b.logprobs_k[sample_rows] >= 0).any():
                step.raw = step.sampled.clone()
        runs, first = {}, 0
        for i, c in enumerate(inputs.spec):
            if b.constrained[c.seq.row]:
                runs[i] = (first, c.seq, c.draft)
            first += c.num_tokens
        if runs:
            step.masked_runs = runs
            if b.num_special and (b.logprobs_k[[c.seq.row for c in inputs.spec]] >= 0).any():
                step.raw_verified = step.verified.clone()  # type: ignore[union-attr]

    def sample(self, step: LaunchedStep) -> InFlightStep:
        """Sample the step's sampled rows (their logits masked by now) and score its prompt rows."""
        rows, inputs = self.rows, step.inputs
        sample_rows = inputs.sample_rows
        num_sampled = sample_rows.size
        logits, sampled = step.logits, step.sampled
        prompt = [(p, _to_host(self.sampler.prompt_logprobs(
            logits[p.offset : p.offset + p.count],
            to_device(np.asarray(p.seq.token_ids[p.first + 1 : p.first + 1 + p.count], np.int64), self.device))))
            for p in inputs.prompt]  # fmt: skip
        b = self.batch
        if not num_sampled:
            none = np.zeros(0, np.int64)
            return InFlightStep(rows=sample_rows, seq_ids=none, version=b.version, ascending=True, packed=_NO_TOKENS,
                                ready=None, logprobs=None, prompt=prompt, tokens=none,
                                hits=np.zeros(0, np.bool_))  # fmt: skip
        seq_ids, version = step.seq_ids, step.version
        if not rows.copy and not step.drawing and not step.processing:  # the CPU, greedy: numpy, no torch ops
            return self._greedy_on_host(sampled, sample_rows, inputs.sample_rows_ascending, prompt, seq_ids, version,
                                        step.raw)  # fmt: skip
        else:
            temperature = b.temperature[sample_rows]
            srows_dev = to_device(sample_rows, self.device)
            counter = b.num_tokens[sample_rows] + b.num_pending[sample_rows] - 1 - b.num_prompt[sample_rows]
            params = SamplingRows(
                temperature, b.top_k[sample_rows], b.top_p[sample_rows], rows.fparams.index_select(0, srows_dev),
                rows.iparams.index_select(0, srows_dev), to_device(counter, self.device), b.min_p[sample_rows],
            )  # fmt: skip
            penalized = None
            if step.processing:
                processed, penalized = self.processing.apply(sampled, sample_rows, counter)
                tokens = self.sampler.sample(processed, params)
            else:
                tokens = self.sampler.sample(sampled, params)
            if penalized is not None:
                self.processing.count(penalized, tokens)
            rows.last_token.index_copy_(0, srows_dev, tokens)  # the next decode step's inputs
            hits = stop_hits(tokens, rows.stop_ids.index_select(0, srows_dev))
            packed = _to_host(tokens | (hits.to(torch.int64) << 32))
        ready = None
        if self.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()
        return InFlightStep(rows=sample_rows, seq_ids=seq_ids, version=version, ascending=inputs.sample_rows_ascending,
                            packed=packed, ready=ready, logprobs=self._logprobs(step.raw, tokens, sample_rows),
                            prompt=prompt)  # fmt: skip

    def verify(self, step: LaunchedStep, cuts: dict[int, RunCut]) -> list[SpecRun]:
        """The verify runs' kept tokens (their logits masked by now; `cuts`: the masked runs' grammar
        cuts, by index in the runs), with their logprobs where asked."""
        runs = self.verifier.verify(step.verified, step.inputs.spec, cuts)  # type: ignore[arg-type]
        self.verifier.logprobs(step.raw_verified, runs)  # type: ignore[arg-type]
        return runs

    def _logprobs(self, sampled: torch.Tensor, tokens: torch.Tensor, sample_rows: np.ndarray) -> tuple | None:
        """InFlightStep.logprobs for the sampled rows whose requests asked for them (None: no row)."""
        b = self.batch
        if not b.num_special:
            return None
        ks = b.logprobs_k[sample_rows]
        want = np.flatnonzero(ks >= 0)
        if not want.size:
            return None
        idx = to_device(want, self.device)
        values, ids, chosen = self.sampler.logprobs(sampled.index_select(0, idx), tokens.index_select(0, idx),
                                                    int(ks[want].max()))  # fmt: skip
        return want, _to_host(values), _to_host(ids), _to_host(chosen)

    def _greedy_on_host(self, logits: torch.Tensor, sample_rows: np.ndarray, ascending: bool, prompt: list,
                        seq_ids: np.ndarray, version: int, raw: torch.Tensor) -> InFlightStep:  # fmt: skip
        """What the device path does for greedy rows when the device is this CPU and the mirrored
        arrays are the host's, with numpy (a few us) instead of ~10 small torch ops."""
        b = self.batch
        ids = logits.numpy().argmax(-1)
        at = b.span(sample_rows, ascending)
        b.last_token[at] = ids  # the next decode step's inputs
        hits = (b.stop_ids[at] == ids[:, None]).any(-1)
        logprobs = self._logprobs(raw, torch.from_numpy(ids), sample_rows)
        return InFlightStep(rows=sample_rows, seq_ids=seq_ids, version=version, ascending=ascending, packed=_NO_TOKENS,
                            ready=None, logprobs=logprobs, prompt=prompt, tokens=ids, hits=hits)

    @torch.inference_mode()
    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Final normed hidden states of a prefill-only step, no logits ([T, H], or [N, H] for
        meta.output_rows): the embedder's forward, over the same KV cache and backend (the base model:
        embeddings take no adapter)."""
        if self.model.lora is not None:
            self.model.lora.clear()
        return self.model(input_ids, positions, meta, self.kv_caches)

    def _copy_blocks(self, copies: list[tuple[int, int, int]]) -> None:
        """Copy-on-write of shared KV blocks (forked choices): for each (group, src, dst), block dst :=
        block src in every layer of that KV cache group."""
        for group in sorted({g for g, _, _ in copies}):
            src = to_device(np.asarray([s for g, s, _ in copies if g == group], np.int64), self.device)
            dst = to_device(np.asarray([d for g, _, d in copies if g == group], np.int64), self.device)
            for k, v in self.group_caches[group]:
                k.index_copy_(0, dst, k.index_select(0, src))
                v.index_copy_(0, dst, v.index_select(0, src))

    def _logits(self, inputs: StepInputs) -> torch.Tensor:
        """fp32 logits of the step's logits rows (see step_inputs)."""
        meta = inputs.meta
        lora = self.model.lora is not None and self.model.lora.active  # adapter steps run eagerly (graphs: base)
        if self.graphs is not None and not inputs.num_prefill_tokens and inputs.input_ids.shape[0] <= self.graphs.sizes[-1] \
                and not lora:  # fmt: skip
            return self.graphs.run(inputs.input_ids, inputs.positions, meta)
        stacked = self.model.stack_takes(inputs.input_ids, meta, self.kv_caches)
        if stacked and self.model.decode_stack.head_takes():  # the lm_head in the same call
            logits = self.model.decode_stack.logits(inputs.input_ids, inputs.positions, meta)
            # a pure decode step: every row is a decode row and has its logits
            return logits if inputs.logit_rows is None else logits.index_select(0, inputs.logit_rows)
        hidden = self.model(inputs.input_ids, inputs.positions, meta, self.kv_caches, stacked=stacked)
        if inputs.logit_rows is not None:
            hidden = hidden.index_select(0, inputs.logit_rows)
        if not hidden.shape[0]:
            return hidden.new_empty((0, self.model.cfg.vocab_size), dtype=torch.float32)
        return self.model.compute_logits(hidden)
