"""StepOutputs: a finished step's sampled tokens applied to their sequences.

The step's one host copy holds each sampled row's token id and whether it is a stop token (EOS
unless ignored, or one of the request's stop ids; checked on the device). For the plain rows (still
in the batch, no stop strings, no logprobs) everything is array work: tokens appended to their lists
with one C-level map, counters bumped, finished rows found with numpy; only rows that finish, cross
into a new prefix-cache block, have stop strings or want logprobs run Python (a constrained row
runs one grammar check: its matcher consumes the token; StructuredOutputs.check). Rows whose sequence
left the batch after the step was launched (preempted, or finished while this step was in flight)
go through `departed`; the extra token of a sequence that had already finished is dropped.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from worker.engine.model_runner import InFlightStep
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Sequence
from worker.engine.speculation.verifier import SpecRun
from worker.engine.stats import EngineStats
from worker.engine.structured_outputs import StructuredOutputs


class StepOutputs:
    def __init__(self, scheduler: Scheduler, stats: EngineStats, stop_string: Callable[[Sequence], bool]) -> None:
        self.scheduler = scheduler
        self.batch = scheduler.batch
        self.stats = stats
        self.stop_string = stop_string  # True (and seq.text cut) when the completion hit a stop string

    def apply(self, step: InFlightStep) -> list[Sequence]:
        """Wait for the step's results and apply them; returns the sequences that finished."""
        finished = self._apply(step)
        if step.spec:
            finished.extend(self._apply_spec(step.spec))
        return finished

    def _apply_spec(self, runs: list[SpecRun]) -> list[Sequence]:
        """Speculation's verified rows: their kept tokens one by one, each checked for a stop (token,
        string, a completed grammar), a grammar error and the length limit as a decoded token is; a
        finish drops the tokens after it. The
        row keeps the K/V of its accepted tokens (num_computed) and gives back the blocks past them."""
        b, sched = self.batch, self.scheduler
        finished = []
        for run in runs:
            seq, row = run.seq, run.row
            self.stats.spec_runs += 1
            self.stats.spec_proposed_tokens += run.proposed
            self.stats.spec_accepted_tokens += run.accepted
            stops = b.stop_ids[row].tolist()  # (a list: `in` on a few ids beats a numpy comparison per token)
            done, limit, last = None, int(b.limit[row]), len(run.tokens) - 1
            for i, token in enumerate(run.tokens):
                seq.token_ids.append(token)
                if run.logprobs is not None and seq.logprobs is not None:
                    seq.logprobs.append(run.logprobs[i])
                verdict = None
                if seq.constraint_state is not None:  # the grammar check of a plain step's token
                    verdict = run.failure if i == last and run.failure else StructuredOutputs.check(seq, token)
                if verdict is not None and verdict != "finished":
                    done = "error"
                elif token in stops or verdict or (seq.params.stop and self.stop_string(seq)):
                    done = "stop"
                elif len(seq.token_ids) >= limit:
                    done = "length"
                if done is not None:
                    break
            kept = len(seq.token_ids) - int(b.num_tokens[row])  # the row's counters, once per run
            b.num_tokens[row] += kept
            b.num_pending[row] -= 1  # the newest token's K/V, and that of each accepted token before the last
            b.num_computed[row] += kept - 1
            self.stats.decode_tokens += kept
            if done is not None:
                seq.finish(done, verdict if done == "error" else None)
                sched.finish(seq)
                finished.append(seq)
                continue
            sched.bm.truncate(seq, len(seq.token_ids))  # rollback: the rejected tokens' blocks
            b.trim_blocks(seq)
            if sched.bm.enable_prefix_caching:
                sched.commit_row(row)
        return finished

    def _apply(self, step: InFlightStep) -> list[Sequence]:
        tokens, hits = step.results()
        for scores, logp in step.prompt:
            if not scores.seq.is_finished:
                scores.seq.prompt_logprobs.extend(logp.tolist())
        if not step.rows.size:
            return []
        b = self.batch
        finished: list[Sequence] = []
        if step.version == b.version and not b.num_special:
            special = None  # every row still holds its sequence, none needs per-row work
        else:
            live = b.seq_id[step.rows] == step.seq_ids
            special = ~live | b.has_stop_strings[step.rows] | (b.logprobs_k[step.rows] >= 0)
        if special is not None and special.any():
            logprob_of = {} if step.logprobs is None else {int(i): j for j, i in enumerate(step.logprobs[0])}
            for i in np.flatnonzero(special).tolist():
                seq = b.seqs[step.rows[i]] if live[i] else self._departed(int(step.seq_ids[i]))
                if seq is not None and self._apply_one(seq, int(tokens[i]), bool(hits[i]), step, logprob_of.get(i)):
                    finished.append(seq)
            plain = np.flatnonzero(~special)
            rows, tokens, hits = step.rows[plain], tokens[plain], hits[plain]
        else:
            rows = step.rows
        if not rows.size:
            return finished
        b.append_tokens(rows, tokens.tolist(), step.ascending)
        self.stats.decode_tokens += rows.size
        at = b.span(rows, step.ascending)
        num_tokens = b.num_tokens[at]
        stopped = hits | (num_tokens >= b.limit[at])
        verdicts = self._constraints(rows, tokens) if b.num_constrained else {}
        if verdicts:
            stopped[list(verdicts)] = True
        if stopped.any():
            for j in np.flatnonzero(stopped).tolist():
                seq = b.seqs[rows[j]]
                verdict = verdicts.get(j)
                if verdict is not None and verdict != "finished":
                    seq.finish("error", verdict)
                else:
                    seq.finish("stop" if hits[j] or verdict else "length")
                self.scheduler.finish(seq)
                finished.append(seq)
        if self.scheduler.bm.enable_prefix_caching and self.scheduler.config.overlap_steps:
            # a computed block whose last token just arrived (without overlap, the token of a block's
            # last position is on the host when that position is scheduled: committed then)
            full = rows[num_tokens % b.block_size == 0]
            if full.size:
                self.scheduler.commit_rows(full[b.active[full]])
        return finished

    def _constraints(self, rows: np.ndarray, tokens: np.ndarray) -> dict[int, str]:
        """Advance the constrained rows' grammars by their new tokens: {index in rows: verdict} for
        those that end now (StructuredOutputs.check: "finished" or an error)."""
        b = self.batch
        verdicts = {}
        for j in np.flatnonzero(b.constrained[rows]).tolist():
            verdict = StructuredOutputs.check(b.seqs[rows[j]], int(tokens[j]))  # type: ignore[arg-type]
            if verdict is not None:
                verdicts[j] = verdict
        return verdicts

    def _departed(self, seq_id: int) -> Sequence | None:
        """The sequence that left the batch with this token in flight (None once it was aborted)."""
        seq = self.scheduler.departed.get(seq_id)
        if seq is not None:
            seq.in_flight -= 1
            if not seq.in_flight:
                del self.scheduler.departed[seq_id]
        return seq

    def _apply_one(self, seq: Sequence, token: int, hit: bool, step: InFlightStep, lp: int | None) -> bool:
        """One row the array path does not cover; True if its sequence finished now."""
        if seq.is_finished:  # a token sampled past the sequence's end (overlapped steps): dropped
            return False
        if seq.batch is not None:
            self.batch.append_tokens(np.array([seq.row]), [token])
        else:
            seq.token_ids.append(token)
        self.stats.decode_tokens += 1
        if lp is not None and seq.logprobs is not None:
            _, values, ids, chosen = step.logprobs  # type: ignore[misc]
            k = seq.params.logprobs or 0
            entry = dict(zip(ids[lp, :k].tolist(), values[lp, :k].tolist(), strict=True))
            entry[token] = float(chosen[lp])
            seq.logprobs.append(entry)
        limit = min(seq.num_prompt_tokens + seq.params.max_tokens, self.scheduler.max_model_len)
        verdict = StructuredOutputs.check(seq, token) if seq.constraint_state is not None else None
        if verdict is not None and verdict != "finished":
            seq.finish("error", verdict)
        elif hit or verdict == "finished" or (seq.params.stop and self.stop_string(seq)):
            seq.finish("stop")
        elif len(seq.token_ids) >= limit:
            seq.finish("length")
        else:
            if seq.batch is not None and self.scheduler.bm.enable_prefix_caching:
                self.scheduler.commit_rows(np.array([seq.row]))
            return False
        self.scheduler.finish(seq)
        return True
