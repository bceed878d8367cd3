"""A chat template rendered as transformers' ``apply_chat_template`` does, so a tokenizer
without transformers gives the same prompt: the same sandboxed jinja2 environment (trim and
lstrip blocks, loop controls, non-ASCII ``tojson``, ``raise_exception``, ``strftime_now``) and
``continue_final_message`` (a tag after the last message, cut there). Messages are
role/content dicts of strings."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache, partial

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
Message = dict[str, str]


def render_chat(template: str, messages: list[Message], add_generation_prompt: bool = False,
                continue_final_message: bool = False, **variables: str) -> str:
    """``messages`` in ``template``; ``variables`` (the special tokens: ``bos_token`` ...)
    are visible to it. Raises ValueError for an empty conversation or options that cannot
    combine, and jinja2's TemplateError where the template refuses the messages."""
    if not messages:
        raise ValueError("Cannot apply chat template to an empty conversation. Provide at "
                         "least one message.")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt are not compatible")
    chat = [_aliased({key: value for key, value in message.items() if value is not None})
            for message in messages]
    final = ""
    if continue_final_message:
        final = chat[-1].get("content")
        if final is None:
            raise ValueError('continue_final_message is set but the final message has no '
                             '"content" to continue!')
        if "content" not in template:
            raise ValueError('continue_final_message is set to "content" but this is not an '
                             'accepted field in the chat_template')
        chat[-1] = {**chat[-1], "content": final + _CONTINUE_TAG}
    rendered = _compiled(template).render(messages=chat, tools=None, documents=None,
                                          add_generation_prompt=add_generation_prompt, **variables)
    if continue_final_message:
        tag = _CONTINUE_TAG.strip()
        if final.strip() not in rendered or tag not in rendered:
            raise ValueError("continue_final_message is set but the final message does not "
                             "appear in the chat after applying the chat template")
        at = rendered.rindex(tag)
        rendered = rendered[:at] if rendered[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG \
            else rendered[:at].rstrip()
    return rendered


def _aliased(message: dict) -> dict:
    """A message's reasoning under every name templates read it by, as transformers does."""
    reasoning = next((message[key] for key in _REASONING_FIELDS
                      if message.get(key) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _Namespace(jinja2.utils.Namespace):
    """jinja2's namespace refusing underscore names, as transformers' sandbox does."""

    def __init__(*args, **kwargs) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"but got {name!r}.")


class _Dict:
    """``dict`` for templates, without attribute access to the type itself."""

    def __call__(self, *args, **kwargs) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Generation(jinja2.ext.Extension):
    """``{% generation %}`` blocks (training masks' marks): rendered as their content."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_content"), [], [], body) \
            .set_lineno(lineno)

    def _content(self, caller) -> str:
        return caller()


@lru_cache(maxsize=8)
def _compiled(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = partial(json.dumps, ensure_ascii=False)  # non-ASCII text kept
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       dict=_Dict(), namespace=_Namespace)
    return env.from_string(template)
