"""LLM: the offline entry point, vLLM's shape (``generate`` and ``chat``)."""

from __future__ import annotations

import itertools

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pagedchat.engine.config import EngineConfig
from pagedchat.engine.errors import RequestError, invalid_text
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.outputs import RequestOutput
from pagedchat.engine.sampling_params import SamplingParams

Message = dict[str, str]


class LLM:
    def __init__(self, model: str | None = None, **options) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **options))
        self.tokenizer = self.engine.tokenizer
        self._request_ids = itertools.count()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers, if any (also done at exit)."""
        self.engine.shutdown()

    def generate(self, prompts: str | list[int] | list[str] | list[list[int]],
                 sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_progress: bool = False) -> list[RequestOutput]:
        """Run every prompt to the end, continuously batched; outputs in input order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        ids = [str(next(self._request_ids)) for _ in prompts]
        for request_id, prompt, p in zip(ids, prompts, params_list):
            self.engine.add_request(request_id, prompt, p)
        finished: dict[str, RequestOutput] = {}
        with Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), disable=not use_progress, transient=True) as bar:
            task = bar.add_task("generate", total=len(ids))
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        bar.advance(task)
        return [finished[request_id] for request_id in ids]

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | None = None,
             use_progress: bool = False) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation or a list of them."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.encode_chat(conversation) for conversation in conversations]
        return self.generate(prompts, sampling_params, use_progress)

    def encode_chat(self, messages: list[Message]) -> list[int]:
        if problem := invalid_text(messages, "messages"):
            raise RequestError(problem[1], "messages")
        encoded = self.tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True)
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
