"""How results leave a bench: rich tables on a terminal, ``key=value`` lines when piped,
JSON with metadata, and PNG plots."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from contextlib import contextmanager
from importlib import metadata as importlib_metadata
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

stdout = Console()
stderr = Console(stderr=True)


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


def note(message: str) -> None:
    """A line for the reader (on stderr, so that piped stdout stays parseable)."""
    stderr.print(message, highlight=False, soft_wrap=True)


@contextmanager
def progress(description: str, total: int):
    """A progress bar on stderr; yields ``advance(k)``. Silent when stderr is not a terminal."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=stderr, transient=True,
                   disable=not stderr.is_terminal)
    with bar:
        task = bar.add_task(description, total=total)
        yield lambda k=1: bar.advance(task, k)


def _version(name: str) -> str | None:
    try:
        return importlib_metadata.version(name)
    except importlib_metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                              capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def cpu_description() -> dict[str, object]:
    """The CPU a figure came from: its name, family and model (as Linux reports them), and
    whether it has AVX2 and AVX-512; elsewhere what ``platform`` knows."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    return {"name": fields.get("model name") or platform.processor() or platform.machine(),
            "family": fields.get("cpu family"), "model": fields.get("model"),
            "avx2": "avx2" in flags, "avx512": "avx512f" in flags}


def run_metadata(engine_config, model_source: str) -> dict[str, object]:
    """What a result needs to be compared with another: model, weights and KV layout,
    versions, machine (the CPU, and the level of the CPU kernels in use)."""
    from pagedchat.kernels.cpu import isa

    return {
        "model": model_source,
        "dtype": engine_config.dtype,
        "weights": engine_config.weights,
        "block_size": engine_config.block_size,
        "num_kv_blocks": engine_config.num_kv_blocks,
        "versions": {"python": platform.python_version(),
                     **{name: _version(name) for name in ("pagedchat", "torch", "transformers")}},
        "git_commit": _git_commit(),
        "cpu_count": os.cpu_count(),
        "cpu": cpu_description(),
        "cpu_kernels": isa(),
    }


def engine_metadata(engine) -> dict[str, object]:
    """``run_metadata`` of a built engine."""
    return run_metadata(engine.config, engine.model_files.source)


def write_json(path: Path, meta: dict[str, object], engines: dict[str, object],
               **extra: object) -> None:
    path.write_text(json.dumps({"metadata": meta, "engines": engines, **extra}, indent=2,
                               allow_nan=True) + "\n")
    note(f"results written to {path}")


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
