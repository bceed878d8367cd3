"""RequestOutputs from sequence groups: the n best samples or beams, the text safe to show."""

from __future__ import annotations

from pagedchat.engine.outputs import CompletionOutput, RequestOutput
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.engine.sequence import Sequence, SequenceGroup


def request_output(group: SequenceGroup, tokenizer) -> RequestOutput:
    """What ``group`` has produced so far, as its caller sees it."""
    if group.params.use_beam_search:
        return _beam_output(group, tokenizer)
    params = group.params
    seqs = sorted(group.seqs, key=lambda s: s.index)
    if params.best_of > params.n and not group.unfinished_seqs:
        seqs = sorted(seqs, key=lambda s: -s.cumulative_logprob)[: params.n]
    elif params.best_of > params.n:
        seqs = seqs[: params.n]
    outputs = []
    for i, seq in enumerate(seqs):
        visible = _visible_text(seq, params)
        delta = visible[seq.emitted_chars :]
        seq.emitted_chars = len(visible)
        outputs.append(CompletionOutput(
            i, visible, seq.output_token_ids, seq.cumulative_logprob, seq.finish_reason, delta,
            list(seq.token_logprobs) if params.logprobs is not None else None))
    return _output(group, outputs, group.is_finished)


def _beam_output(group: SequenceGroup, tokenizer) -> RequestOutput:
    """The n best finished hypotheses, best first, once the search is over; until then
    the n best live beams (their text is whole each time: beams change, nothing streams)."""
    n = group.params.n
    outputs, scores = [], []
    if group.is_finished:
        for i, hypothesis in enumerate(group.beam_hypotheses[:n]):
            text = tokenizer.decode(hypothesis.token_ids, skip_special_tokens=True)
            outputs.append(CompletionOutput(i, text, hypothesis.token_ids,
                                            hypothesis.cumulative_logprob,
                                            hypothesis.finish_reason, text))
            scores.append(hypothesis.score)
    else:
        for i, seq in enumerate(group.seqs[:n]):
            text = tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
            outputs.append(CompletionOutput(i, text, seq.output_token_ids, seq.cumulative_logprob))
    return _output(group, outputs, group.is_finished, scores)


def failed_output(group: SequenceGroup) -> RequestOutput:
    """The output of a request that failed while its output was built: no text, its error."""
    outputs = [CompletionOutput(i, "", seq.output_token_ids, None, "error")
               for i, seq in enumerate(group.seqs[: group.params.n])]
    return _output(group, outputs, True)


def _output(group: SequenceGroup, outputs: list[CompletionOutput], finished: bool,
            beam_scores: list[float] | None = None) -> RequestOutput:
    return RequestOutput(group.request_id, group.prompt, group.prompt_token_ids, outputs,
                         finished, group.num_cached_tokens, group.metrics, beam_scores or [],
                         group.error)


def _visible_text(seq: Sequence, params: SamplingParams) -> str:
    """Text safe to show now: while a stop string could still be forming, hold back
    its length minus one characters."""
    if seq.is_finished or not params.stop:
        return seq.output_text
    hold = max(map(len, params.stop)) - 1
    return seq.output_text[: max(len(seq.output_text) - hold, 0)]
