"""Request bodies of the OpenAI API (the parts pagedchat serves), checked by pydantic. Fields
that change nothing here (``user``, ``store``, ``metadata``) are ignored; those asking what
pagedchat cannot do (tools, ``echo``, ``suffix``) are refused by the routes, by name."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from pagedchat.engine.errors import invalid_text


class _Body(BaseModel):
    # strict: a value of the wrong JSON type is refused, not converted ("8", true, "yes")
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """OpenAI's clients send null for "not set": the field's default applies. Text no
        tokenizer encodes (JSON's "\\ud800") is refused here, by its field's path."""
        if problem := invalid_text(data):
            raise PydanticCustomError("invalid_text", "{message}",
                                      {"message": problem[1], "param": problem[0]})
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchema(_Body):
    name: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class SamplingFields(_Body):
    """What chat and completions share: vLLM's names, OpenAI's defaults."""

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = Field(None, ge=1)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None
    functions: list[Any] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    best_of: int | None = Field(None, ge=1, le=128)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]
