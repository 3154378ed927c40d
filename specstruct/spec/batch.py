"""Many requests decoded in lockstep: each step() runs ONE target pass (plus packed draft passes) for all rows.

A step is plan -> execute -> apply, with frozen records between them (step_plan.py):
  plan     each decoding row proposes with the free proposers on its own constraint fork; the batch-aware
           policy (batch_policy.py) trims them and sets each row's draft-model length; rows reading their prompt
           get the next chunk within the step's budget (prefill_budget.py); the model-step proposer drafts for all
           rows in packed passes (proposers/draft_model.py), a row's draft reading its context the first time the
           policy gives the row the draft model, up to CATCH_UP tokens a step; the masks of every position.
           -> StepPlan
  execute  one packed target pass over every row's [last committed token, candidates] and every prefill chunk
           (packed.py: each row attends to its own KV only, so its logits do not depend on the batch) -> StepResult
  apply    each row accepts its own prefix under its own masks, crops its own cache, commits the target's next
           token; the policy learns the pass's cost, a finished prompt goes to the prefix cache (kv_reuse.py);
           finished rows leave and free their caches

Prefill is bounded per step, not per row (admission order): with P prompts being read and D rows decoding, a
step may last 1 + P/D decode-only steps (measured pass costs), never less than `prefill_chunk` tokens (a long
prompt never freezes running rows), at most 256. `adaptive_prefill=False` keeps `prefill_chunk`. Chunking changes
no result.

The scheduler may `pause` a row between steps (its KV handed out, to be spilled) and `resume` it later; a row
whose spilled KV was lost prefills its prompt and committed tokens again (`Row.fill_to`) before it decodes on.

A row that fails (its constraint raises, say) is finished alone with `finish_reason == "error"` and the exception
on `row.error`; the other rows are untouched.
"""

from __future__ import annotations

import time

from specstruct.runtime.kv.layers import SeqKV
from specstruct.spec.batch_policy import Demand, allocate, free_lengths, pass_time, probe_trimmed
from specstruct.spec.interfaces import Runtime, Sequence_
from specstruct.spec.kv_reuse import KVReuse
from specstruct.spec.prefill_budget import prefill_budget
from specstruct.spec.proposers.draft_model import DraftState, Job
from specstruct.spec.row import Row, Step
from specstruct.spec.speculator import Speculator
from specstruct.spec.step_plan import Prefill, StepPlan, StepResult, Verify


CATCH_UP = 256  # context tokens a draft reads per step when it first drafts for a row (as IDLE_PREFILL)


class BatchDecoder:
    """Decodes many requests in lockstep. `add` admits a row made by `speculator.row(...)`; `step` advances all;
    finished rows leave by themselves, `remove` cancels one."""

    def __init__(self, speculator: Speculator, *, prefill_chunk: int = 32, adaptive_prefill: bool = True):
        self.speculator = speculator
        self.prefill_chunk = max(1, prefill_chunk)  # the per-step prefill budget while rows decode (its floor)
        self.adaptive_prefill = adaptive_prefill  # False: exactly prefill_chunk while rows decode
        self.rows: list[Row] = []
        self.proposer = speculator.proposers.batched  # the model-step proposer (the draft model), if any
        self.draft: Runtime | None = self.proposer.runtime if self.proposer is not None else None
        self.reuse = KVReuse(speculator, self.draft)  # where a row's KV starts, what the prefix cache keeps

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: Row) -> None:
        """Admit a request; its prompt is prefilled by the following steps."""
        row.kv = self._start(row)
        row.started = time.perf_counter()
        cfg = row.config
        if self.draft is not None and cfg.enable_speculative and cfg.use_draft_model:
            row.draft_kv = self.reuse.draft(row)
        self.rows.append(row)

    def _start(self, row: Row) -> Sequence_:
        """The row's target KV sequence, from the longest cached prefix of its prompt. At least the prompt's last
        token always runs: its logits are needed."""
        seq, row.prefilled = self.reuse.target(row, row.prompt[:-1])
        row.stats.cached_prompt_tokens = row.prefilled
        return seq

    def remove(self, row: Row) -> None:
        """Cancel (or forget a finished) row: frees its KV caches and constraint state."""
        if row in self.rows:
            self.rows.remove(row)
        row.kv = row.draft_kv = None
        if not row.finished:  # cancelled: its stats still say what it did
            row.stats.new_tokens = len(row.token_ids)
            row.stats.elapsed_s = time.perf_counter() - row.started
            row.stats.batch_rows = row.rows_seen / row.passes if row.passes else 0.0

    # -- preemption (engine/preempt.py decides whom and keeps the KV meanwhile) ----------------------------------
    def pause(self, row: Row) -> tuple[SeqKV, SeqKV | None]:
        """Take a row out between steps without finishing it: returns what its target and draft caches held
        (token ids and layers) and forgets them here. Its constraint, drafters, generator and stats stay on it."""
        self.rows.remove(row)
        kv = row.target_kv
        target = _held(kv, (row.prompt + row.token_ids)[: kv.length])
        d = row.draft_kv
        draft = None if d is None else _held(d.kv, d.tokens[: d.kv.length])
        row.kv = row.draft_kv = None
        return target, draft

    def resume(self, row: Row, target: SeqKV, draft: SeqKV | None) -> None:
        """Put a paused row back with what `pause` returned (layers None: lost; the following steps prefill those
        tokens again, bit for bit the same KV under row-invariant numerics; a lost draft cache catches up)."""
        rt = self.speculator.target
        if target.layers is not None or not target.tokens:
            row.kv = rt.sequence(target.layers, len(target.tokens))
        else:
            row.fill_to = max(len(row.prompt), len(target.tokens))
            row.kv, row.prefilled = self.reuse.target(row, target.tokens if row.token_ids else row.prompt[:-1])
        if draft is not None:  # lost layers: an empty draft cache, which catches up by itself
            row.draft_kv = DraftState(self.reuse.draft_runtime(), draft.layers, draft.tokens if draft.layers is not None else ())
        self.rows.append(row)

    def _alone(self, row: Row) -> bool:
        return row.seeded and not self.reuse.draft_runtime().row_invariant

    def _fail(self, row: Row, err: BaseException) -> None:
        if not row.finished:
            row.finish("error", err)

    # -- one step: plan -> execute -> apply ------------------------------------------------------------------
    def step(self) -> list[tuple[Row, list[int], bool]]:
        """One step for every row: (row, tokens it committed, whether it finished) per row, finished rows gone."""
        plan = self.plan()
        return self.apply(plan, self.execute(plan))

    def plan(self) -> StepPlan:
        """Propose (free proposers per row, then the model-step proposer for all), size the batch, choose the prefill
        chunks and compute the masks: the step's plan. A row whose proposing fails is finished here, alone."""
        t0 = time.perf_counter()
        rows = list(self.rows)
        decoding = [r for r in rows if not r.prefilling]
        steps: dict[int, Step] = {}
        for r in decoding:
            try:
                steps[id(r)] = r.draft_free(alone=len(rows) == 1)
            except Exception as err:
                self._fail(r, err)
        live = [r for r in decoding if id(r) in steps and not r.finished]
        if len(live) > 1:
            self._size_free(live, steps)
            live = [r for r in live if not r.finished]
        demands, ks = self._draft_lengths(live, steps)
        fed = sum(1 + len(steps[id(r)].cands) for r in live) + sum(ks)  # at most what they feed the target
        chunks = self._chunks([r for r in rows if r.prefilling], len(live), fed)
        drafted = self._draft_model(live, steps, demands, ks)
        verify = []
        for r in decoding:
            if id(r) in steps and not r.finished:
                s = steps[id(r)]
                try:
                    masks = r.masks(s)
                except Exception as err:
                    self._fail(r, err)
                    continue
                verify.append(Verify(r, r.target_kv, (r.token_ids[-1], *s.cands), tuple(masks), s.proposal(),
                                     with_model=id(r) in drafted))
        prefill = [Prefill(r, r.target_kv, tuple(c), 1 if r.prefilled + len(c) == r.fill_to and not r.token_ids else 0)
                   for r, c in chunks]  # keep 0 on a re-prefill: its logits are not needed
        return StepPlan(tuple(rows), tuple(verify), tuple(prefill), started=t0)

    def execute(self, plan: StepPlan) -> StepResult:
        """The plan's one packed target pass (each row attends to its own KV only); reads nothing but the plan."""
        if not plan.entries:
            return StepResult()
        t0 = time.perf_counter()
        try:
            logits = self.speculator.target.forward(plan.segments(), plan.keep(), plan.masks())
        except Exception as err:
            return StepResult(seconds=time.perf_counter() - t0, error=err)
        return StepResult(tuple(logits), time.perf_counter() - t0)

    def apply(self, plan: StepPlan, result: StepResult) -> list[tuple[Row, list[int], bool]]:
        """The pass's outcome, in one place: prefill progress and the prefix cache, acceptance and commits, the
        policy's costs and a lone row's step time, stats; finished rows leave. Returns (row, tokens, finished)."""
        out: dict[int, list[int]] = {id(r): [] for r in plan.rows}
        members = [e.row for e in plan.entries]
        if result.error is not None:  # every row in the pass has a half-written cache now
            for r in members:
                self._fail(r, result.error)
        elif plan.entries:
            self.speculator.policy.observe_cost("target", plan.tokens, result.seconds)
            for e, lg in zip(plan.entries, result.logits):
                r = e.row
                r.saw_pass(len(members), result.seconds)
                try:
                    if isinstance(e, Prefill):
                        r.prefilled += len(e.feed)
                        if not r.prefilling and not r.token_ids:
                            self.reuse.remember(r)
                            out[id(r)] += r.after_prefill(lg[-1])
                    else:
                        r.stats.verify_time_s += result.seconds
                        out[id(r)] += r.verify(e.proposal, lg, list(e.masks))
                except Exception as err:
                    self._fail(r, err)
        if len(plan.rows) == 1 and plan.verify and plan.rows[0].config.enable_speculative:  # a lone row's seconds
            r, e = plan.rows[0], plan.verify[0]  # are its own
            r.policy.observe_step(r.constraint.mode, e.with_model, len(out[id(r)]), time.perf_counter() - plan.started)
        done = []
        for r in plan.rows:
            if r.finished:
                self.remove(r)
            done.append((r, out[id(r)], r.finished))
        return done

    def _chunks(self, prefilling: list[Row], decoding: int, fed: int) -> list[tuple[Row, list[int]]]:
        budget = self.prefill_chunk if decoding and not self.adaptive_prefill else prefill_budget(
            self.prefill_chunk, len(prefilling), decoding, fed, lambda n: pass_time(self.speculator.policy, n))
        chunks = []
        for r in prefilling:
            if budget <= 0:
                break
            c = r.prefill_chunk(budget)
            chunks.append((r, c))
            budget -= len(c)
        return chunks

    def _size_free(self, decoding: list[Row], steps: dict[int, Step]) -> None:
        """In a pass of several rows, keep the free candidates that raise the batch's expected tokens per second
        (batch_policy.free_lengths); a lone row keeps all its own (its verification rows are nearly free)."""
        chains = [r.policy.candidate_rates(r.constraint.mode, steps[id(r)].segments, r.config.adaptive_threshold,
                                           own=r.rates) for r in decoding]
        keep = free_lengths(self.speculator.policy, chains, [r.seeded for r in decoding])
        shared = [i for i, r in enumerate(decoding) if r.policy is self.speculator.policy]  # not a seeded row's own
        probed = probe_trimmed(self.speculator.policy,
                               [(decoding[i].constraint.mode, steps[id(decoding[i])].segments, keep[i]) for i in shared])
        for i, n in zip(shared, probed):
            keep[i] = n
        for r, n, chain in zip(decoding, keep, chains):
            s = steps[id(r)]
            if n < len(chain):
                try:
                    fork = r.constraint.fork()
                    if n:
                        fork.advance(s.cands[:n])
                except Exception as err:  # this row's constraint failed: it ends with its error, the others go on
                    self._fail(r, err)
                    continue
                s.trim(n, fork)
                s.model_room = max(0, min(s.model_limit, s.budget - n))  # the batch policy sizes the model's share

    def _draft_lengths(self, decoding: list[Row], steps: dict[int, Step]) -> tuple[list[Demand], list[int]]:
        """Each decoding row's demand on the draft model and its draft length (batch_policy.allocate)."""
        if self.draft is None:
            return [], []
        demands = []
        for r in decoding:
            s = steps[id(r)]
            if r.draft_kv is not None and (s.model_room > 0 or s.arbitrates(r.config)):
                rate = r.policy.model_rate(r.constraint.mode)
                rate = r.config.adaptive_threshold if rate is None else rate
                demands.append(Demand(1 + len(s.cands), s.model_room, rate, fixed=r.seeded))
            else:
                demands.append(Demand(1 + len(s.cands), 0, 0.0))
        return demands, allocate(self.speculator.policy, demands) if any(d.limit for d in demands) else [0] * len(demands)

    def _draft_model(self, decoding: list[Row], steps: dict[int, Step], demands: list[Demand],
                     ks: list[int]) -> set[int]:
        """Run the model-step proposer for the rows the policy gave it; returns their ids."""
        proposer = self.proposer
        if proposer is None:
            return set()
        jobs: dict[int, Job] = {}
        for r, d, k in zip(decoding, demands, ks):
            s, state = steps[id(r)], r.draft_kv
            forced = r.config.use_forced_text
            if state is None:
                continue
            if s.arbitrates(r.config):  # the draft arbitrates the free candidates, and drafts
                jobs[id(r)] = Job(state, r.prompt + r.token_ids, r.constraint.fork(), k, 0.0, r.generator,
                                  hint=list(s.cands), limit=s.model_limit, forced=forced,  # in the room it frees
                                  confidence=r.config.draft_confidence)
            elif d.limit and k > 0:
                jobs[id(r)] = Job(state, r.prompt + r.token_ids + s.cands, s.fork, k, r.config.temperature,
                                  r.generator, alone=self._alone(r), forced=forced,
                                  confidence=r.config.draft_confidence)
        for r in decoding:  # a draft asked for the first time reads the row's context first, a chunk per step
            job = jobs.get(id(r))
            if job is not None and len(job.context) - len(job.state.tokens) > CATCH_UP:
                rest = job.state.feed_for(r.prompt + r.token_ids)  # what its cache lacks (it keeps what is right)
                if len(rest) > CATCH_UP:
                    jobs[id(r)] = Job(job.state, rest[:CATCH_UP], None, 0, 0.0, None, alone=self._alone(r),
                                      feed_only=True)
        if not jobs:
            return set()
        unread = [r for r in decoding if id(r) in jobs and len(jobs[id(r)].state.tokens) < len(r.prompt)]
        costs: list[tuple[int, float]] = []
        t0 = time.perf_counter()
        try:
            proposer.propose_batch(list(jobs.values()), costs)
        except Exception as err:  # the draft pass itself failed: its rows' draft caches are unusable
            for r in decoding:
                if id(r) in jobs:
                    self._fail(r, err)
            return set(jobs)
        dt = time.perf_counter() - t0
        for rows, seconds in costs:
            self.speculator.policy.observe_cost("draft", rows, seconds)
        for r in unread:  # the draft has read the prompt now: the prefix cache may keep it
            self.reuse.remember_draft(r)
        for r in decoding:
            j = jobs.get(id(r))
            if j is None:
                continue
            r.stats.draft_time_s += dt
            if j.error is not None:
                self._fail(r, j.error)
                continue
            if j.hint:
                steps[id(r)].keep_free(j.hint_kept, j.legal(), r.stats)
            steps[id(r)].add_runs(j.tokens, j.runs, j.qs)
        return set(jobs)


def _held(seq: Sequence_, tokens: list[int]) -> SeqKV:
    return SeqKV(list(tokens), seq.layers() if seq.length else None)
