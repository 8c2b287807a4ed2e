"""Engine: a known batch of prompts in, one RequestOutput per prompt out."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Mapping
from collections.abc import Sequence as Seq
from pathlib import Path

import structlog
import torch

from contracts.checkpoint.pooling import PoolingConfig, PoolingConfigError
from contracts.lora.config import MAX_LORAS
from contracts.sampling import SamplingParams
from worker.engine.batch_state import PersistentBatch
from worker.engine.block_manager import salt_key
from worker.engine.completion_texts import CompletionTexts
from worker.engine.config import EngineConfig
from worker.engine.embedder import Embedder, EmbeddingOutput, dimensions_per_prompt
from worker.engine.engine_build import build_engine
from worker.engine.kv_groups import block_manager
from worker.engine.loader import read_config
from worker.engine.lora import LoraManager
from worker.engine.model_runner import InFlightStep, LaunchedStep, ModelRunner
from worker.engine.ordering import batch_order
from worker.engine.outputs import RequestOutput
from worker.engine.request_checks import RequestChecks
from worker.engine.scheduler import Scheduler
from worker.engine.scheduler_output import SchedulerOutput
from worker.engine.sequence import Sequence
from worker.engine.speculation.draft import DraftModel
from worker.engine.speculation.speculator import Speculator
from worker.engine.stats import EngineStats
from worker.engine.step_output import StepOutputs
from worker.engine.structured_outputs import RunCut, StructuredOutputs
from worker.engine.tokenizer import Tokenizer

log = structlog.get_logger(__name__)


class Engine:
    """Use Engine.from_pretrained. One generate/stream call at a time per engine.

    max_model_len is the only limit on a prompt's length. LongRoPE (Phi-3 / 3.5 / 4-mini): a prompt
    longer than original_max_position_embeddings is rotated with the long factors at every position,
    its generated tokens too, as transformers does; one that fits keeps the short factors below that
    length and takes the long ones from it. Each sequence's choice is made once, from its prompt
    length, when `_request` creates it (Sequence.rope_offset; models/rotary.py).
    """

    def __init__(self, model_dir: Path, config: EngineConfig, runner: ModelRunner, tokenizer: Tokenizer,
                 max_model_len: int, num_blocks: int, draft: DraftModel | None = None) -> None:  # fmt: skip
        self.model_dir = model_dir
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = runner.model.cfg.vocab_size
        eos = tokenizer.eos_token_ids or runner.model.cfg.eos_token_ids
        self.eos_token_ids = frozenset(eos)
        self.block_manager = block_manager(num_blocks, runner.num_local_blocks, config, runner.model.cfg)
        self.batch = PersistentBatch(config.max_num_seqs, -(-max_model_len // config.block_size), config.block_size,
                                     self.eos_token_ids, grouped=len(runner.groups) > 1)  # fmt: skip
        runner.bind(self.batch, mirror=config.torch_device.type != "cpu", static_decode=bool(config.static_decode))
        model = runner.model
        self.loras = LoraManager(model, model.backend, config.max_loras, config.torch_device, config.torch_dtype,
                                 read_config(model_dir), [str(model_dir)])  # fmt: skip
        self.batch.loras = self.loras
        self.scheduler = Scheduler(config, self.block_manager, self.batch, max_model_len)
        self.stats = EngineStats()
        self.texts = CompletionTexts(tokenizer)
        self.outputs = StepOutputs(self.scheduler, self.stats, self.texts.stop_hit)
        self.speculator = Speculator(config.speculative, self.batch, draft, self.stats) if config.speculative else None
        self._in_flight: InFlightStep | None = None  # overlapped steps: the sampled step whose tokens are not applied yet
        self.structured = StructuredOutputs(model_dir, self.vocab_size, tuple(eos), config.max_num_seqs,
                                            config.torch_device, self.stats, tokenizer)  # fmt: skip
        self.checks = RequestChecks(self.vocab_size, max_model_len, self.structured.error,
                                    self.tokenizer.max_text_chars(max_model_len))  # fmt: skip
        self._next_seq_id = 0
        try:  # embeddings need the checkpoint's sentence-transformers pooling config; generation does not
            self.pooling: PoolingConfig | None = PoolingConfig.from_checkpoint(model_dir, runner.model.cfg.hidden_size)
            self.pooling_error: str | None = None
        except PoolingConfigError as exc:
            self.pooling, self.pooling_error = None, str(exc)

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, config: EngineConfig | None = None) -> Engine:
        """The engine over the checkpoint folder `model_dir` (worker/engine/engine_build.py)."""
        return build_engine(cls, Path(model_dir), config or EngineConfig())

    # ---- public API ------------------------------------------------------------------------
    def set_loras(self, adapters: Mapping[str, str | Path], base_names: tuple[str | None, ...] = (),
                  max_loras: int | None = None) -> None:  # fmt: skip
        """Serve exactly these LoRA adapters (name -> local PEFT folder) from the next stream on;
        `base_names`: names the base model goes by besides its folder (a job's model URL, its served
        name), which an adapter's base_model_name_or_path may give; `max_loras`: adapters resident on
        the device at once (None: EngineConfig.max_loras). ValueError naming
        the adapter that cannot be served (nothing changes then); RuntimeError during a stream."""
        if self.scheduler.has_unfinished():
            raise RuntimeError("this engine is running a stream; finish or close it before changing adapters")
        if max_loras is not None and not 1 <= max_loras <= MAX_LORAS:
            raise ValueError(f"max_loras must be in 1..{MAX_LORAS}, got {max_loras}")
        self.loras.sync(adapters, base_names, max_loras or self.config.max_loras)

    @property
    def lora_names(self) -> list[str]:
        return sorted(self.loras.ids)

    def generate(
        self, prompts: Seq[str] | Seq[Seq[int]], params: SamplingParams | Seq[SamplingParams] | None = None,
        adapters: Seq[str | None] | None = None, cache_salt: str | None = None,
    ) -> list[RequestOutput]:  # fmt: skip
        """One RequestOutput per prompt, in the order of `prompts`."""
        outs = list(self.stream(prompts, params, adapters=adapters, cache_salt=cache_salt))
        return sorted(outs, key=lambda o: o.index)

    def stream(
        self,
        prompts: Seq[str] | Seq[Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        should_stop: Callable[[], bool] | None = None,
        adapters: Seq[str | None] | None = None,
        cache_salt: str | None = None,
    ) -> Iterator[RequestOutput]:
        """Yield each RequestOutput as its request finishes (bad prompts first, as errors).

        should_stop() is checked before every step; once True, unfinished requests are aborted (their
        blocks freed, nothing yielded for them) and the generator returns. `adapters`: each prompt's
        LoRA adapter (a name given to set_loras; None: the base model), or None for all on the base;
        an unknown name is that request's error. `cache_salt`: the prompts reuse prefix-cache blocks
        only of streams with the same salt (None: of unsalted streams), so that one tenant's requests
        neither reuse nor reveal another's (block_manager.root_hash).
        """
        params_list = self.checks.params_for(prompts, params)
        if adapters is not None and len(adapters) != len(prompts):
            raise ValueError(f"adapters has {len(adapters)} entries for {len(prompts)} prompts: give one per prompt")
        if self.scheduler.has_unfinished():
            raise RuntimeError("this engine is already running a stream; finish or close it first")
        salt = salt_key(cache_salt) if cache_salt is not None else 0
        seqs: list[Sequence] = []
        texts = [p for p in prompts if self.checks.encodable(p)]
        encoded = iter(self.tokenizer.encode_batch(texts) if texts else [])
        for i, (prompt, p) in enumerate(zip(prompts, params_list, strict=True)):
            ids, error = self.checks.prompt_ids(prompt, next(encoded) if self.checks.encodable(prompt) else None)
            error = error or self.checks.params_error(p)
            adapter = -1
            if error is None and adapters is not None:
                try:
                    adapter = self.loras.id_of(adapters[i])
                except ValueError as exc:
                    error = str(exc)
            if error is not None:
                yield RequestOutput(i, ids, [], "", "error", len(ids), 0, error=error)
                continue
            seed = p.seed if p.seed is not None else hash((self.config.seed, i)) & 0x7FFF_FFFF_FFFF_FFFF
            self.stats.constrained_requests += p.n if p.constraint is not None else 0
            seqs.append(self._request(i, ids, p, seed, adapter, salt))
        emitted: set[int] = set()  # requests with n > 1 whose output was yielded
        order = self._order(seqs)
        for j in order:
            self.scheduler.add(seqs[j])
        try:
            while self.scheduler.has_unfinished() or self._in_flight is not None:
                if should_stop is not None and should_stop():
                    dropped = self.scheduler.abort_all()
                    self._in_flight = None
                    log.info("engine_stopped", aborted=len(dropped))
                    return
                for seq in self.step():
                    if seq.group is None:
                        yield self.texts.output([seq])
                    elif seq.index not in emitted and all(c.is_finished for c in seq.group):
                        emitted.add(seq.index)
                        yield self.texts.output(seq.group)
        finally:
            if self.scheduler.has_unfinished() or self._in_flight is not None:  # the caller closed early
                self.scheduler.abort_all()
                self._in_flight = None

    def embed(
        self, prompts: Seq[str] | Seq[Seq[int]], dimensions: int | Seq[int | None] | None = None
    ) -> list[EmbeddingOutput]:
        """One EmbeddingOutput per prompt, in the order of `prompts` (see embed_stream)."""
        return sorted(self.embed_stream(prompts, dimensions), key=lambda o: o.index)

    def embed_stream(
        self,
        prompts: Seq[str] | Seq[Seq[int]],
        dimensions: int | Seq[int | None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Generator[EmbeddingOutput, None, None]:
        """Embeddings by the checkpoint's pooling config (contracts/checkpoint/pooling.py): batched prefill,
        pooled final hidden states, truncated to `dimensions` (one for all prompts or one each; None:
        the hidden size), then normalized if the config has a Normalize module. Text prompts are
        tokenized as the tokenizer does (its post-processor may append an EOS). Bad prompts come
        first, as errors; then each forward's outputs. No KV outlives its forward (embedder.py).

        Raises ValueError when the checkpoint has no pooling config, RuntimeError during a stream.
        """
        if self.pooling is None:
            raise ValueError(self.pooling_error)
        self.checks.params_for(prompts, None)  # refuses a single string
        if self.scheduler.has_unfinished():
            raise RuntimeError("this engine is running a generate stream; finish or close it first")
        dims = dimensions_per_prompt(dimensions, len(prompts))
        texts = [p for p in prompts if self.checks.encodable(p)]
        encoded = iter(self.tokenizer.encode_batch(texts) if texts else [])
        errors: list[EmbeddingOutput] = []
        requests: list[tuple[int, list[int], int | None]] = []
        for i, (prompt, d) in enumerate(zip(prompts, dims, strict=True)):
            ids, error = self.checks.prompt_ids(prompt, next(encoded) if self.checks.encodable(prompt) else None, room=0)
            error = error or self.pooling.check_dimensions(d)
            if error is not None:
                errors.append(EmbeddingOutput(i, None, len(ids), error))
            else:
                requests.append((i, ids, d))
        c = self.config
        embedder = Embedder(self.runner, self.block_manager, self.pooling, c.max_num_batched_tokens,
                            c.max_num_seqs, self.stats, self.scheduler.has_unfinished)  # fmt: skip
        return embedder.run(requests, should_stop, errors)

    # ---- one step --------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """One step, phase by phase; returns the sequences that finished.

        1. schedule: speculation's proposals (`_plan`), then the scheduler's plan of the step;
        2. launch: the step's inputs and forward (ModelRunner.launch; on CUDA not waited on);
        3. apply the previous step's tokens (overlapped steps: on the host while the device computes
           this step's forward);
        4. mask the masked rows' logits (`_mask`: a mask needs every token before it, so after 3);
        5. sample, on the device, and start the tokens' copy to the host (ModelRunner.sample);
        6. verify speculation's runs (ModelRunner.verify); speculation observes what they kept;
        7. apply this step's tokens, unless steps overlap (then the next step's phase 3 does);
        8. record the step's busy time, and its cost for speculation.
        """
        t0 = time.perf_counter()
        c0 = time.process_time() if self.speculator is not None else 0.0
        sched = self.scheduler.schedule(self._plan() if self.speculator is not None else None)
        finished = list(sched.errored)
        self._count(sched)
        launched = self.runner.launch(sched) if sched.chunks or sched.decode_rows.size or sched.spec else None
        if self._in_flight is not None:
            finished.extend(self.outputs.apply(self._in_flight))
            self._in_flight = None
        step = None
        if launched is not None:
            cuts = self._mask(launched)
            step = self.runner.sample(launched)
            if launched.inputs.spec:
                step.spec = self.runner.verify(launched, cuts)
                self.speculator.observe(step.spec)  # type: ignore[union-attr]  # before their tokens are applied
        if self.config.overlap_steps:
            self._in_flight = step
        elif step is not None:
            finished.extend(self.outputs.apply(step))
        self._record(sched, t0, c0)
        return finished

    def _plan(self) -> list[tuple[int, list[int]]] | None:
        """Speculation's proposals for this step's decode rows (Speculator.plan)."""
        rows = self.batch.decode_rows()
        if not rows.size:
            return None
        return self.speculator.plan(rows, self.config.max_num_batched_tokens - rows.size,  # type: ignore[union-attr]
                                    bool(self.scheduler.waiting))  # fmt: skip

    def _count(self, sched: SchedulerOutput) -> None:
        """The scheduled step's counts in stats: preemptions, admitted prompts, and when it computes
        anything, a step and its sched.num_prefill_tokens prompt (or recomputed) tokens (its decode
        tokens are counted as they reach the host)."""
        self.stats.preemptions += sched.num_preempted
        for seq in sched.admitted:
            self.stats.prompt_tokens += seq.num_prompt_tokens
            self.stats.cached_tokens += seq.num_cached_tokens or 0
        if sched.chunks or sched.decode_rows.size or sched.spec:
            self.stats.computed_prefill_tokens += sched.num_prefill_tokens
            self.stats.steps += 1

    def _mask(self, step: LaunchedStep) -> dict[int, RunCut]:
        """The masked rows' allowed tokens (structured outputs, thinking budgets: StructuredOutputs),
        applied to their logits in place; returns the masked verify runs' cuts, by index in the runs."""
        if step.masked is not None:
            self.structured.mask(step.sampled, step.masked, step.masked_seqs)  # type: ignore[arg-type]
        if step.masked_runs is None:
            return {}
        cuts = self.structured.mask_runs(step.verified, list(step.masked_runs.values()))  # type: ignore[arg-type]
        return dict(zip(step.masked_runs, cuts, strict=True))

    def _record(self, sched: SchedulerOutput, t0: float, c0: float) -> None:
        """The step's busy time, split between prefill and decode by its token counts
        (EngineStats.add_busy); a pure decode / verify step's cost for speculation."""
        prefill = sched.num_prefill_tokens
        seconds = time.perf_counter() - t0
        self.stats.add_busy(seconds, prefill, sched.num_scheduled_tokens - prefill)
        if self.speculator is not None and not sched.chunks:
            # the CPU's cost is the work done (process time: wall time on a shared machine is noise)
            cpu = self.config.torch_device.type == "cpu"
            cost = time.process_time() - c0 if cpu else seconds
            self.speculator.record(sched.num_scheduled_tokens, cost, bool(sched.spec), cpu)

    # ---- helpers ---------------------------------------------------------------------------
    def _order(self, seqs: list[Sequence]) -> list[int]:
        """The admission order (ordering.batch_order). A batch with adapters goes adapter by adapter
        (batch_order within each; their KV is never shared anyway): each adapter's rows sit together
        in the batch, so its tokens are one run of each step that the LoRA products read in place
        (kernels/reference/lora.py), and when the adapters outnumber the slots on the device a
        sequence waits for a slot only where one adapter's run ends, not at every row."""
        block = self.config.block_size
        if all(s.adapter < 0 for s in seqs):
            return batch_order([s.token_ids for s in seqs], [s.params.max_tokens for s in seqs], block)
        order: list[int] = []
        for aid in sorted({s.adapter for s in seqs}):
            mine = [j for j, s in enumerate(seqs) if s.adapter == aid]
            sub = batch_order([seqs[j].token_ids for j in mine], [seqs[j].params.max_tokens for j in mine], block)
            order += [mine[k] for k in sub]
        return order

    def _request(self, index: int, ids: list[int], params: SamplingParams, seed: int, adapter: int = -1,
                 salt: int = 0) -> Sequence:  # fmt: skip
        """The sequence of choice 0; with n > 1 the other choices wait in its `forks` (choice i draws
        with seed + i, vLLM's rule, so choice 0 is the n = 1 request). adapter: the LoRA's id, -1 none;
        salt: the stream's salt_key, 0 none."""
        group = []
        for choice in range(params.n):
            seq = Sequence(self._next_seq_id, index, ids, params, seed + choice)
            seq.rope_offset = self.runner.model.rope_offset(len(ids))  # LongRoPE: a long prompt's rotary rows
            seq.adapter = adapter
            seq.cache_salt = salt
            self._next_seq_id += 1
            seq.choice = choice
            group.append(seq)
        if params.n > 1:
            group[0].forks = group[1:]
            for seq in group:
                seq.group = group
        return group[0]
