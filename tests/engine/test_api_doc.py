"""pagedchat/engine/API.md is true to the code: the options and fields it lists are the
dataclasses' own, in their order and with their defaults; every ``llm.x`` and ``engine.x`` it
names exists; its Examples run; its Layout names every module of the engine."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from pagedchat.engine.config import EngineConfig
from pagedchat.engine.llm import LLM
from pagedchat.engine.outputs import CompletionOutput, RequestOutput
from pagedchat.engine.sampling_params import SamplingParams
from pagedchat.engine.sequence import RequestMetrics

ENGINE = Path(__file__).resolve().parents[2] / "pagedchat" / "engine"
API = (ENGINE / "API.md").read_text(encoding="utf-8")
CONTRACT = API.split("```python\n", 1)[1].split("```", 1)[0]


def call_in(text: str, name: str) -> ast.Call:
    """The first call ``name(...)`` in ``text``, parsed (comments inside it allowed)."""
    start = text.index(name + "(")
    depth = 0
    for end in range(start + len(name), len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if depth == 0:
            break
    return ast.parse(text[start : end + 1], mode="eval").body


def defaults_of(cls) -> list[tuple[str, object]]:
    found = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else (
            f.default)
        found.append((f.name, default))
    return found


def listed_fields(name: str) -> list[str]:
    """The field names of "`name`: `a, b: type (note), c`", nested brackets left out."""
    text = API.split(f"`{name}`: `", 1)[1].split("`", 1)[0]
    flat = ""
    depth = 0
    for char in text:
        depth += char in "([" and 1 or 0
        if depth == 0:
            flat += char
        depth -= char in ")]" and 1 or 0
    return [part.split(":")[0].strip() for part in flat.split(",")]


def test_llm_options_are_the_engine_configs():
    call = call_in(CONTRACT, "LLM")
    listed = [(k.arg, ast.literal_eval(k.value)) for k in call.keywords]
    assert listed == defaults_of(EngineConfig)


def test_sampling_params_are_the_dataclass():
    call = call_in(API[API.index("`SamplingParams(n=") + 1 :], "SamplingParams")
    listed = [(k.arg, ast.literal_eval(k.value)) for k in call.keywords]
    assert listed == defaults_of(SamplingParams)


@pytest.mark.parametrize("cls", [RequestOutput, RequestMetrics, CompletionOutput],
                         ids=lambda c: c.__name__)
def test_output_fields_are_the_dataclasses(cls):
    assert listed_fields(cls.__name__) == [f.name for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("method", ["generate", "chat"])
def test_llm_methods_take_what_is_listed(method):
    call = call_in(CONTRACT, f"llm.{method}")
    expected = inspect.signature(getattr(LLM, method)).parameters
    for keyword in call.keywords:
        assert expected[keyword.arg].default == ast.literal_eval(keyword.value), keyword.arg


def test_every_named_attribute_exists(tiny_llm):
    for owner, instance in (("llm", tiny_llm), ("engine", tiny_llm.engine)):
        names = set(re.findall(rf"^{owner}\.(\w+)", CONTRACT, re.MULTILINE))
        assert names, owner
        missing = [name for name in names if not hasattr(instance, name)]
        assert not missing, f"API.md names {owner}.{missing}"


def test_the_examples_run(tiny_model_dir, shared_model_loads, capsys):
    examples = API.split("## Examples", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", examples, re.DOTALL)
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "API.md", "exec"), {"MODEL": str(tiny_model_dir)})
    assert capsys.readouterr().out


def test_the_layout_names_every_engine_module():
    layout = API.split("## Layout", 1)[1].split("```", 2)[1]
    named = {Path(name).name for name in re.findall(r"[\w/]+\.py", layout)}
    modules = {path.name for path in ENGINE.rglob("*.py") if path.name != "__init__.py"}
    assert named == modules
