"""What the routes share: the engine loop, the server's own tokenizer, the settings,
and turning request bodies into prompts and SamplingParams."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from dataclasses import dataclass

from pagedchat.engine.errors import RequestError
from pagedchat.engine.llm_engine import LLMEngine
from pagedchat.engine.loading.tokenizer import load_hf_tokenizer, load_tokenizer
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.server import protocol
from pagedchat.server.engine_loop import EngineLoop
from pagedchat.server.errors import APIError
from pagedchat.server.formatting import TokenTexts
from pagedchat.server.metrics import ServerMetrics
from pagedchat.server.structured import GrammarProcessor, Grammars

log = logging.getLogger("pagedchat.server")


@dataclass
class ServerSettings:
    model_name: str  # the name answers carry
    aliases: tuple[str, ...] = ()  # other names a client may ask for
    api_key: str | None = None
    log_prompts: bool = False  # prompt text in the log; off: only counts are logged
    drain_timeout: float = 30.0  # after SIGTERM, running requests get this long to finish
    max_request_bytes: int = 1 << 20  # a longer body is refused with 413 unread
    read_timeout: float = 30.0  # seconds a client may take to send its headers, or its body
    max_concurrent_requests: int = 1024  # completions at once; 429 past it

    @property
    def model_names(self) -> list[str]:
        """Every name answered to: each as given and without a quantization suffix
        (``SmolLM2-135M-Instruct.Q4_1`` -> ``SmolLM2-135M-Instruct``)."""
        return list(dict.fromkeys(form for name in (self.model_name, *self.aliases)
                                  for form in (name, _QUANT_SUFFIX.sub("", name)) if form))


# llama.cpp's file-name suffixes: .Q4_1, -Q4_K_M, -q8_0, -IQ4_XS, -f16, -bf16
_QUANT_SUFFIX = re.compile(r"[.\-_](?:i?q\d\w*|f16|f32|bf16)$", re.IGNORECASE)


class ServerState:
    def __init__(self, engine: LLMEngine, settings: ServerSettings) -> None:
        self.engine_loop = EngineLoop(engine)
        self.settings = settings
        self.config = engine.config
        self.vocab_size = engine.vocab_size
        self.fit = engine.request_fit
        # its own tokenizer: the engine thread uses the engine's at the same time
        self.tokenizer = load_tokenizer(engine.model_config)
        self._tokenizer_lock = threading.Lock()
        self.eos_token_ids = sorted(engine.eos_token_ids)
        self.metrics = ServerMetrics()
        model_config = engine.model_config
        # xgrammar reads transformers' tokenizer class: loaded at the first grammar only
        self.grammars = Grammars(lambda: load_hf_tokenizer(model_config), self.vocab_size,
                                 self.eos_token_ids)
        self.texts = TokenTexts(self.tokenizer)
        self.draining = False
        self.created = int(time.time())

    def check_model(self, model: str | None) -> None:
        names = self.settings.model_names
        if model is not None and model not in names:
            raise APIError(404, f"the model {model!r} does not exist; this server serves "
                           + " or ".join(map(repr, names)), "model", "model_not_found")

    # ---- prompts (the tokenizer runs on a worker thread: the event loop stays free) -------
    async def chat_prompt(self, messages: list[protocol.ChatMessage]) -> list[int]:
        conversation = [{"role": _ROLES.get(m.role, m.role), "content": _text(m, i)}
                        for i, m in enumerate(messages)]
        try:
            encoded = await self._tokenize(self.tokenizer.apply_chat_template, conversation,
                                           add_generation_prompt=True, tokenize=True)
        except Exception as error:  # the template rejects the conversation (jinja raises)
            raise APIError(400, f"messages: the chat template refused them ({error})",
                           "messages") from error
        return list(encoded if isinstance(encoded, list) else encoded["input_ids"])

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return await self._tokenize(self.tokenizer.encode, text,
                                    add_special_tokens=add_special_tokens)

    async def _tokenize(self, call, *args, **kwargs):
        """``call`` on a worker thread, one at a time: a fast tokenizer sets its truncation
        state on each call and refuses a second caller meanwhile ("Already borrowed")."""
        def locked():
            with self._tokenizer_lock:
                return call(*args, **kwargs)

        return await asyncio.to_thread(locked)

    async def completion_prompts(self, prompt) -> list[list[int]]:
        if isinstance(prompt, str):
            return [await self.encode(prompt)]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]
        if not prompt:
            raise APIError(400, "prompt: must not be empty", "prompt")
        return [await self.encode(p) if isinstance(p, str) else list(p) for p in prompt]

    def check_prompt_fits(self, prompt: list[int], sequences: int, param: str) -> None:
        """413 for a prompt the model or whole pool can never hold (with one new token)."""
        context, blocks, size = (self.config.max_model_len, self.config.num_kv_blocks,
                                 self.config.block_size)
        if len(prompt) >= context:
            raise APIError(413, f"the prompt has {len(prompt)} tokens but the model's context "
                           f"is {context} tokens (it must leave room for one new token)",
                           param, "context_length_exceeded")
        if self.fit.blocks(len(prompt), 1, sequences) > self.fit.num_blocks:
            raise APIError(413, f"the prompt has {len(prompt)} tokens x{sequences} sequences "
                           f"but the KV pool holds {blocks} blocks of {size} tokens",
                           param, "context_length_exceeded")

    def log_request(self, request_id: str, prompts: list[list[int]], params: SamplingParams,
                    ) -> None:
        log.info("%s: %d prompt(s), %d prompt tokens, max_tokens=%d, n=%d", request_id,
                 len(prompts), sum(map(len, prompts)), params.max_tokens, params.n)
        if self.settings.log_prompts:
            for prompt in prompts:
                log.info("%s prompt: %r", request_id, self.tokenizer.decode(prompt))

    async def sampling_params(self, body: protocol.SamplingFields, prompts: list[list[int]],
                              ) -> SamplingParams:
        is_chat = isinstance(body, protocol.ChatCompletionRequest)
        best_of = (body.best_of if isinstance(body, protocol.CompletionRequest) else None) or body.n
        if best_of < body.n:
            raise APIError(400, f"best_of ({best_of}) must be >= n ({body.n})", "best_of")
        if body.stream_options is not None and not body.stream:  # OpenAI's and vLLM's 400
            raise APIError(400, "stream_options needs stream: true", "stream_options")
        if body.stream and best_of > body.n:
            raise APIError(400, "best_of > n cannot stream", "best_of")
        for prompt in prompts:
            self.check_prompt_fits(prompt, best_of, "messages" if is_chat else "prompt")
        requested = (body.max_completion_tokens or body.max_tokens) if is_chat else body.max_tokens
        longest = max(map(len, prompts))
        if requested is None:  # OpenAI: as many as fit, here in the context and the pool
            requested = self.fit.longest(best_of) - longest
        elif longest + requested > self.config.max_model_len:
            field = "max_completion_tokens" if is_chat and body.max_completion_tokens else (
                "max_tokens")
            raise APIError(400, f"{field}: the model's context is {self.config.max_model_len} "
                           f"tokens, but {longest + requested} were asked for ({longest} in "
                           f"the prompt, {requested} in the completion); lower {field}",
                           field, "context_length_exceeded")
        structured = body.response_format is not None and body.response_format.type != "text"
        if body.ignore_eos and structured:
            raise APIError(400, "ignore_eos cannot be combined with response_format (the "
                           "grammar ends the reply)", "ignore_eos")
        if is_chat:
            logprobs = (body.top_logprobs or 0) if body.logprobs else None
            if body.top_logprobs and not body.logprobs:
                raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        else:
            logprobs = body.logprobs
        processors = [await self._grammar(body)] if structured else []
        try:
            return SamplingParams(
                n=body.n, best_of=best_of,
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p,
                top_k=body.top_k or 0, min_p=body.min_p or 0.0,
                presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
                repetition_penalty=body.repetition_penalty, seed=body.seed,
                max_tokens=requested, stop=body.stop or [],
                stop_token_ids=body.stop_token_ids or [], ignore_eos=body.ignore_eos,
                min_tokens=body.min_tokens, logprobs=logprobs,
                logit_bias=_logit_bias(body.logit_bias), logits_processors=processors)
        except RequestError as error:
            raise APIError(400, str(error), error.param) from error

    async def _grammar(self, body: protocol.SamplingFields) -> GrammarProcessor:
        fmt = body.response_format
        if body.min_tokens:
            raise APIError(400, "min_tokens cannot be combined with response_format "
                           "(the grammar may end before)", "min_tokens")
        schema = None
        if fmt.type == "json_schema":
            if fmt.json_schema is None or not fmt.json_schema.schema_:
                raise APIError(400, "response_format: json_schema needs a schema",
                               "response_format")
            schema = fmt.json_schema.schema_
        try:
            grammar = await asyncio.to_thread(self.grammars.compile, fmt.type, schema)
        except ValueError as error:
            raise APIError(400, str(error), "response_format") from error
        return GrammarProcessor(grammar, self.vocab_size)


# OpenAI's "developer" messages are the system prompt of the newer models
_ROLES = {"developer": "system"}


def _text(message: protocol.ChatMessage, index: int) -> str:
    """A message's text; content parts other than text are refused."""
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    texts = []
    for part in message.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise APIError(400, f"messages.{index}.content: only text parts are supported, "
                           f"got type {part.get('type')!r}", f"messages.{index}.content")
        texts.append(part["text"])
    return "\n".join(texts)


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if not bias:
        return None
    try:
        return {int(token): value for token, value in bias.items()}
    except ValueError as error:
        raise APIError(400, "logit_bias: keys must be token ids", "logit_bias") from error
