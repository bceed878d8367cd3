"""LLMEngine: add requests, step, stream outputs back.

``add_request`` queues a SequenceGroup; each ``step`` asks the scheduler who runs, hands the
runner that step as a StepInput, and the logits it gives back are sampled, appended,
detokenized, checked for stops and returned as RequestOutputs. Block tables change only in
the scheduler (forks and endings included): the engine never touches the block manager."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import torch

from pagedchat.engine.block_manager import BlockManager
from pagedchat.engine.config import EngineConfig, parse_bytes
from pagedchat.engine.errors import ModelLoadError, RequestError, invalid_text
from pagedchat.engine.kv_store import KVStore
from pagedchat.engine.loading.loader import ModelFiles
from pagedchat.engine.opening import OpenedModel, eos_token_ids, open_model
from pagedchat.engine.outputs import EngineStats, RequestOutput
from pagedchat.engine.parallel.parallel_runner import ParallelRunner
from pagedchat.engine.request_outputs import failed_output, request_output
from pagedchat.engine.runner.model_runner import ModelRunner
from pagedchat.engine.runner.protocol import Runner
from pagedchat.engine.sampling.beam_search import beam_step, fork_beams
from pagedchat.engine.sampling.detokenizer import IncrementalDetokenizer
from pagedchat.engine.sampling.sampler import SampleRow, apply_penalties, sample, token_logprobs
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from pagedchat.engine.sequence import Sequence, SequenceGroup
from pagedchat.engine.speculation import verify_drafts
from pagedchat.engine.stats import engine_stats
from pagedchat.engine.step_input import StepOutput

log = logging.getLogger("pagedchat.engine")


class LLMEngine:
    def __init__(self, config: EngineConfig | OpenedModel) -> None:
        """``config``: the engine's, or a model :func:`open_model` opened with it."""
        start = time.perf_counter()
        opened = config if isinstance(config, OpenedModel) else open_model(config)
        self.model_files: ModelFiles = opened.files
        self.tokenizer = opened.tokenizer
        self.config = config = opened.config
        model_config = opened.model_config
        folder = self.model_files.folder
        runner_class = ParallelRunner if config.tensor_parallel_size > 1 else ModelRunner
        try:
            self.runner: Runner = runner_class(self.config, model_config)
        except KeyError as error:
            raise ModelLoadError(f"{folder}: weights do not match the config ({error})") from error
        self.config = replace(self.config, num_kv_blocks=self.runner.num_blocks)
        self.scheduler = Scheduler(self.config, BlockManager(
            self.runner.num_blocks, config.block_size, self.runner.num_host_blocks,
            config.enable_prefix_caching, self.runner.kv_groups.windows))
        self.kv_store = None if config.kv_store is None else KVStore(
            self, config.kv_store, parse_bytes(config.kv_store_cap))
        # whether a request fits this engine's context and pool (the scheduler's rule)
        self.request_fit = self.scheduler.fit
        self.eos_token_ids = eos_token_ids(model_config, self.tokenizer)
        self.vocab_size = model_config.vocab_size
        self.model_config = model_config
        self.load_seconds = time.perf_counter() - start

    def add_request(self, request_id: str, prompt: str | list[int],
                    params: SamplingParams | None = None,
                    arrival_time: float | None = None) -> None:
        """Queue a request; a request that can never be served raises RequestError now."""
        params = params or SamplingParams()
        if self.scheduler.find(request_id) is not None:
            raise RequestError(f"request id {request_id!r} is already in use", "request_id")
        text = prompt if isinstance(prompt, str) else None
        if problem := invalid_text(text, "prompt"):
            raise RequestError(problem[1], "prompt")
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_request(token_ids, params)
        if self.kv_store is not None:
            self.kv_store.load(token_ids)
        group = SequenceGroup(request_id, text, token_ids, params, arrival_time)
        group.seqs[0].detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids)
        self.scheduler.add(group)

    def _check_request(self, token_ids: list[int], params: SamplingParams) -> None:
        if not token_ids:
            raise RequestError("the prompt is empty", "prompt")
        if any(isinstance(t, bool) or not isinstance(t, int) for t in token_ids) or (
                min(token_ids) < 0 or max(token_ids) >= self.vocab_size):
            raise RequestError(f"prompt token ids must be in [0, {self.vocab_size})", "prompt")
        limit = self.config.max_model_len
        if len(token_ids) >= limit:
            raise RequestError(
                f"the prompt has {len(token_ids)} tokens but the model's context is {limit} "
                "tokens (it must leave room for at least one new token)", "prompt")
        self.request_fit.check(len(token_ids), params)
        if params.use_beam_search and self.config.speculative:
            raise RequestError(f"beam search does not combine with speculative decoding "
                               f"(the engine runs --speculative {self.config.speculative})",
                               "use_beam_search")
        if params.use_beam_search and params.stop:
            raise RequestError("beam search does not take stop strings (stop_token_ids work)",
                               "stop")
        for param, tokens in (("logit_bias", params.logit_bias or {}),
                              ("stop_token_ids", params.stop_token_ids)):
            if outside := [t for t in tokens if not 0 <= t < self.vocab_size]:
                raise RequestError(f"{param} names token {outside[0]}, outside the vocabulary "
                                   f"[0, {self.vocab_size})", param)

    def abort_request(self, request_id: str) -> None:
        """Stop a request and free its blocks at once (unknown ids are ignored)."""
        group = self.scheduler.find(request_id)
        if group is None:
            return
        self.scheduler.abort(group)
        group.metrics.finished_time = time.time()
        if self.kv_store is not None:
            self.kv_store.save_group(group)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (a benchmark's next round starts cold)."""
        self.scheduler.reset_prefix_cache()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def stats(self) -> EngineStats:
        stats = engine_stats(self.scheduler, self.kv_cache_dtype)
        return stats if self.kv_store is None else replace(
            stats, kv_store_read=self.kv_store.loaded, kv_store_written=self.kv_store.saved)

    @property
    def kv_cache_dtype(self) -> str:
        """The K/V pool's element type in force: int8, or the activations' dtype."""
        return str(self.runner.kv_dtype).removeprefix("torch.")

    def shutdown(self) -> None:
        """Release the model's workers (tensor parallelism); safe to call twice."""
        self.runner.shutdown()

    def step(self) -> list[RequestOutput]:
        """Run one iteration; return the requests that advanced."""
        timer = self.runner.timer
        started = time.perf_counter()
        with timer.phase("schedule"):
            out = self.scheduler.schedule()
        if out.is_empty:
            return []
        timed_rows = self._timed_rows(out)
        timer.steps += 1
        now = time.time()
        for item in out.scheduled:
            if item.group.metrics.first_scheduled_time is None:
                item.group.metrics.first_scheduled_time = now
        sampling = [item for item in out.scheduled if item.samples and not item.draft]
        drafting = [item for item in out.scheduled if item.draft]
        with timer.phase("prepare"):
            step = out.step_input(self.config.block_size)
            step.argmax_rows = [row for row, item in enumerate(sampling) if self._argmax_only(item)]
            plain_argmax = len(step.argmax_rows)
            draft_argmax = [self._argmax_only(item) for item in drafting]
            row = len(sampling)  # a drafted sequence's rows follow the plain ones (step_input)
            for item, greedy in zip(drafting, draft_argmax, strict=True):
                if greedy:
                    step.argmax_rows.extend(range(row, row + 1 + len(item.draft)))
                row += 1 + len(item.draft)
        result = self.runner.execute(step)
        if result.failed:  # rows the model computed NaN or infinity for: their requests end
            owners = [item.group for item in sampling] + [
                item.group for item in drafting for _ in range(1 + len(item.draft))]
            for row in result.failed:
                self._fail(owners[row], RequestError(
                    "the model computed NaN or infinity in this step: its weights look "
                    "corrupt (download the file again)"))
        with timer.phase("sample+detokenize"):
            plain_logits = len(sampling) - plain_argmax
            advanced = self._process(out, sampling, step.argmax_rows[:plain_argmax], StepOutput(
                result.logits[:plain_logits], result.tokens[:plain_argmax]))
            advanced.update((group.request_id, group) for group in verify_drafts(
                self, drafting, draft_argmax, result.tokens[plain_argmax:],
                result.logits[plain_logits:]))
            outputs = self._outputs(advanced)
        if timed_rows:
            self.scheduler.proposer.timed(timed_rows, time.perf_counter() - started)
        return outputs

    def _timed_rows(self, out: SchedulerOutput) -> int:
        """The query rows of this step where it is what the proposer's step costs time (a
        lone sequence decoding, with or without a draft), else 0."""
        if self.scheduler.proposer is None or len(out.scheduled) != 1:
            return 0
        item = out.scheduled[0]
        decoding = (item.samples and item.seq.num_output_tokens > 0
                    and item.num_new_tokens == 1 + len(item.draft))
        return item.num_new_tokens if decoding else 0

    def _argmax_only(self, item: ScheduledSeq) -> bool:
        """Whether this row's next token is the argmax of the raw logits, nothing else
        wanted from them (its cumulative_logprob is then not kept)."""
        return item.group.params.argmax_only and not self._banned(item.group.params, item.seq)

    def _process(self, out: SchedulerOutput, sampling: list[ScheduledSeq],
                 argmax_rows: list[int], result: StepOutput) -> dict[str, SequenceGroup]:
        """Sample, append and check stops; return the groups that advanced. What fails for
        one request here (its logits processor, its sampling values, its stop check) ends
        that request with an error and frees its blocks; the others of the step go on."""
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
        logits = result.logits
        advanced: dict[str, SequenceGroup] = {}
        for row, token in zip(argmax_rows, result.tokens, strict=True):
            group = sampling[row].group
            advanced[group.request_id] = group
            if group.error is not None:  # failed in this step
                continue
            try:
                [seq] = self._seqs_to_sample(sampling[row])
                seq.append_token(token, None)
                self._after_token(group, seq)
            except Exception as error:
                self._fail(group, error)
        argmax = set(argmax_rows)
        rows, logit_rows, seqs = [], [], []
        beams: dict[str, tuple[SequenceGroup, dict[int, int]]] = {}  # (group, seq id -> row)
        others = (item for i, item in enumerate(sampling) if i not in argmax)
        for row, item in enumerate(others):  # row: of the logits
            group = item.group
            if group.error is not None:  # failed in this step: nothing to sample or fork
                advanced[group.request_id] = group
                continue
            if group.params.use_beam_search:
                beams.setdefault(group.request_id, (group, {}))[1][item.seq.seq_id] = row
                continue
            for seq in self._seqs_to_sample(item):
                rows.append(SampleRow(group.params, group.prompt_token_ids,
                                      seq.output_token_ids, group.generator,
                                      self._banned(group.params, seq)))
                logit_rows.append(row)
                seqs.append((group, seq))
        if rows:
            # every row is sampled once in a plain decode batch: no copy of the logits then
            every_row = logit_rows == list(range(len(logits)))
            row_logits = logits if every_row else logits[logit_rows]
            tokens, logprobs = self._sample(row_logits, rows, seqs)
            for (group, seq), token, logprob in zip(seqs, tokens, logprobs, strict=True):
                advanced[group.request_id] = group
                if token is None or group.error is not None:
                    continue
                try:
                    seq.append_token(token, logprob)
                    self._after_token(group, seq)
                except Exception as error:
                    self._fail(group, error)
        for request_id, (group, seq_rows) in beams.items():
            advanced[request_id] = group
            try:
                self._advance_beams(group, logits[[seq_rows[seq.seq_id] for seq in group.seqs]])
            except Exception as error:
                self._fail(group, error)
        return advanced

    def _outputs(self, advanced: dict[str, SequenceGroup]) -> list[RequestOutput]:
        """The advanced groups' outputs; a group with every sequence finished ends here."""
        now = time.time()
        results = []
        for group in advanced.values():
            metrics = group.metrics
            metrics.first_token_time = metrics.first_token_time or now
            metrics.last_token_time = now
            # one time per output token: a speculative step can append several
            produced = max((seq.num_output_tokens for seq in group.seqs), default=0)
            metrics.token_times.extend([now] * max(produced - len(metrics.token_times), 1))
            if not group.is_finished and not group.unfinished_seqs:
                self.scheduler.finish(group)
                group.metrics.finished_time = time.time()
                if self.kv_store is not None:
                    self.kv_store.save_group(group)
            try:
                results.append(request_output(group, self.tokenizer))
            except Exception as error:
                self._fail(group, error)
                results.append(failed_output(group))
        return results

    def _sample(self, logits: torch.Tensor, rows: list[SampleRow],
                seqs: list[tuple[SequenceGroup, Sequence]],
                ) -> tuple[list[int | None], list[float | None]]:
        """Every row sampled at once; if that fails, each request's rows on their own, so
        that only the request at fault fails (its rows then give None)."""
        max_logsumexp = self.runner.kernels.max_logsumexp
        try:
            tokens, logprobs = sample(logits, rows, max_logsumexp)
            self._record_logprobs(logits, rows, seqs, tokens)
            return tokens, logprobs
        except Exception:
            pass
        by_request: dict[str, list[int]] = {}
        for i, (group, _) in enumerate(seqs):
            by_request.setdefault(group.request_id, []).append(i)
        tokens_or_none: list[int | None] = [None] * len(rows)
        logprobs_or_none: list[float | None] = [None] * len(rows)
        for indices in by_request.values():
            group_rows, group_logits = [rows[i] for i in indices], logits[indices]
            try:
                tokens, logprobs = sample(group_logits, group_rows, max_logsumexp)
                self._record_logprobs(group_logits, group_rows, [seqs[i] for i in indices], tokens)
            except Exception as error:
                self._fail(seqs[indices[0]][0], error)
                continue
            for i, token, logprob in zip(indices, tokens, logprobs, strict=True):
                tokens_or_none[i], logprobs_or_none[i] = token, logprob
        return tokens_or_none, logprobs_or_none

    def _fail(self, group: SequenceGroup, error: Exception) -> None:
        """End one request whose own work failed: its sequences finish with "error" and its
        blocks are freed now; the reason travels in its RequestOutput."""
        if group.error is not None:
            return
        group.error = f"{type(error).__name__}: {error}"
        # a request's own error is for its caller to report (once); a fault of ours is logged here
        if not isinstance(error, RequestError):
            log.error("request %s failed: %s", group.request_id, group.error, exc_info=error)
        self.scheduler.abort(group, "error")
        group.metrics.finished_time = time.time()

    def _banned(self, params: SamplingParams, seq: Sequence) -> tuple[int, ...]:
        """The ids that may not end the sequence yet (min_tokens)."""
        if seq.num_output_tokens >= params.min_tokens:
            return ()
        eos = set() if params.ignore_eos else self.eos_token_ids
        return tuple(sorted(eos | set(params.stop_token_ids)))

    @staticmethod
    def _record_logprobs(logits: torch.Tensor, rows: list[SampleRow],
                         seqs: list[tuple[SequenceGroup, Sequence]], tokens: list[int]) -> None:
        wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
        if not wanted:
            return
        entries = token_logprobs(logits[wanted], [tokens[i] for i in wanted],
                                 [rows[i].params.logprobs for i in wanted])
        for i, entry in zip(wanted, entries, strict=True):
            seqs[i][1].token_logprobs.append(entry)

    def _advance_beams(self, group: SequenceGroup, logits: torch.Tensor) -> None:
        """One beam step: score the live beams' log-softmax rows (penalties apply to them, as
        transformers' logits processors do), fork the survivors, free the pruned at once."""
        params = group.params
        logprobs = logits.float().log_softmax(dim=1)
        apply_penalties(logprobs, [SampleRow(params, group.prompt_token_ids,
                                             seq.output_token_ids, None) for seq in group.seqs])
        eos = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_token_ids)
        prompt_len = len(group.prompt_token_ids)
        max_new = min(prompt_len + params.max_tokens, self.config.max_model_len) - prompt_len
        running, done = beam_step(group, logprobs, eos, max_new)
        group.seqs = fork_beams(self.scheduler, group.seqs, [] if done else running)

    def _seqs_to_sample(self, item: ScheduledSeq) -> list[Sequence]:
        """The sequences sampled from this row: after the prompt of an n > 1 request,
        its best_of samples fork here and share the prompt's blocks."""
        group = item.group
        if group.forked:
            return [item.seq]
        parent = item.seq
        children = [parent]
        for index in range(1, group.params.best_of):
            children.append(self.scheduler.fork(parent, index))
        group.seqs = children
        group.forked = True
        return children

    def _after_token(self, group: SequenceGroup, seq: Sequence) -> None:
        params = group.params
        previous = len(seq.output_text)
        seq.output_text += seq.detokenizer.step(seq.token_ids)
        token = seq.token_ids[-1]
        reason = None
        is_eos = not params.ignore_eos and token in self.eos_token_ids
        may_stop = seq.num_output_tokens >= params.min_tokens  # before, end tokens are masked
        if may_stop and (is_eos or token in params.stop_token_ids):
            reason = "stop"
        elif may_stop and params.stop:
            window = seq.output_text[max(previous - max(map(len, params.stop)), 0) :]
            hits = [window.find(s) for s in params.stop if s in window]
            if hits:
                cut = max(previous - max(map(len, params.stop)), 0) + min(hits)
                seq.output_text = seq.output_text[:cut]
                reason = "stop"
        if reason is None and (seq.num_output_tokens >= params.max_tokens
                               or seq.num_tokens >= self.config.max_model_len):
            reason = "length"
        if reason is not None:
            self.scheduler.finish_seq(seq, reason)
