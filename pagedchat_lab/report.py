"""How results leave a bench: rich tables on a terminal, ``key=value`` lines when piped,
JSON with metadata, and PNG plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pagedchat.console import engine_metadata, note, stdout


def _cell(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.3g}" if abs(value) < 1 else f"{value:,.2f}"
    return str(value)


def _plain(value: object) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.6g}"
    return str(value).replace(" ", "_")


def emit_table(title: str, rows: list[dict[str, object]], columns: list[str],
               console: Console = stdout) -> None:
    """Rows as a table on a terminal, else one ``title key=value ...`` line per row.
    Column names are the stable snake_case keys of the JSON output."""
    if console.is_terminal:
        table = Table(title=title)
        for column in columns:
            table.add_column(column.replace("_", " "), justify="left" if column == columns[0]
                             else "right")
        for row in rows:
            table.add_row(*(_cell(row.get(column, "")) for column in columns))
        console.print(table)
    else:
        slug = title.lower().replace(" ", "_")
        for row in rows:
            console.print(slug, *(f"{c}={_plain(row.get(c, ''))}" for c in columns),
                          soft_wrap=True, highlight=False)


def flatten(figures: dict[str, object]) -> dict[str, object]:
    """``{"ttft_ms": {"mean": 1}}`` -> ``{"ttft_ms_mean": 1}`` for tables."""
    flat: dict[str, object] = {}
    for key, value in figures.items():
        if isinstance(value, dict):
            flat.update({f"{key}_{sub}": v for sub, v in value.items()})
        else:
            flat[key] = value
    return flat


def write_json(path: Path, meta: dict[str, object], engines: dict[str, object],
               **extra: object) -> None:
    path.write_text(json.dumps({"metadata": meta, "engines": engines, **extra}, indent=2,
                               allow_nan=True) + "\n")
    note(f"results written to {path}")


def save(path: Path | None, engine, engines: dict[str, object], **extra: object) -> None:
    """``write_json`` with the engine's metadata, where ``--json`` gave a path."""
    if path:
        write_json(path, engine_metadata(engine), engines, **extra)


def plot_lines(path: Path, series: dict[str, list[tuple[float, float]]], xlabel: str,
               ylabel: str, title: str) -> None:
    """One line per engine (PNG, Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for name, points in series.items():
        xs, ys = zip(*sorted(points), strict=True) if points else ((), ())
        axes.plot(xs, ys, marker="o", label=name)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    note(f"plot written to {path}")


def plot_stacked(path: Path, rows: dict[str, dict[str, float]], parts: list[str],
                 title: str) -> None:
    """Stacked horizontal bars, one per row, of shares summing to 1 (the paper's Fig. 2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 0.6 * len(rows) + 1.5))
    names = list(rows)
    left = [0.0] * len(names)
    for part in parts:
        widths = [rows[name].get(part, 0.0) * 100 for name in names]
        axes.barh(names, widths, left=left, label=part.replace("_", " "))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axes.set_xlabel("share of KV cache memory (%)")
    axes.set_xlim(0, 100)
    axes.set_title(title)
    axes.invert_yaxis()
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    note(f"plot written to {path}")
