"""`pagedchat bench isolation`: streams' pace and /health while big bodies are refused."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli.options import user_errors
from pagedchat_lab.cli import options as opt


def isolation(model: opt.Model = None, kv_memory: opt.KvMemory = "256MiB",
              streams: Annotated[int, typer.Option(
                  "--streams", min=1, help="Chat streams running in each phase.")] = 4,
              max_tokens: Annotated[int, typer.Option(
                  "--max-tokens", min=2, help="Tokens each stream generates.")] = 256,
              floods: Annotated[int, typer.Option(
                  "--floods", min=1,
                  help="Clients sending big bodies one after another while the streams "
                       "run.")] = 2,
              body_mb: Annotated[float, typer.Option(
                  "--body-mb", min=0.01, help="Size of each big body in MB.")] = 5.0,
              interval: Annotated[float, typer.Option(
                  "--interval", min=0.0,
                  help="Seconds each client waits between two big bodies (0: a flood, "
                       "back to back).")] = 0.5,
              health_interval: Annotated[float, typer.Option(
                  "--health-interval", min=0.001, help="Seconds between two /health "
                                                       "polls.")] = 0.05,
              json_path: opt.JsonPath = None) -> None:
    """Do running streams keep their pace, and /health its speed, while clients send
    bodies over --max-request-bytes? `pagedchat serve` runs as a child; the streams run
    alone, then beside the big bodies."""
    from pagedchat_lab import report
    from pagedchat_lab.isolation import isolation as run

    with user_errors():
        options = opt.engine_options(model, opt.DType.float32, kv_memory=kv_memory)
        figures = run(options, streams, max_tokens, floods, body_mb, interval, health_interval)
        rows = [{"phase": name, **f} for name, f in figures.items()]
        report.emit_table("isolation", rows, [
            "phase", "worst_chunk_gap_ms", "median_chunk_gap_ms", "worst_health_ms",
            "median_health_ms", "health_failures", "big_requests", "big_request_statuses",
            "worst_refusal_ms"])
        alone, flooded = figures["alone"], figures["flooded"]
        ratio = flooded["worst_chunk_gap_ms"] / alone["worst_chunk_gap_ms"]
        console.note(f"{streams} streams of {max_tokens} tokens; {floods} clients sending "
                     f"a {body_mb:g} MB body every {interval:g} s in the second phase; worst "
                     f"gap between chunks with them / without: {ratio:.2f}x")
        if json_path:
            from pagedchat.engine.config import EngineConfig

            meta = console.run_metadata(EngineConfig(model=model, kv_cache_memory=kv_memory),
                                        model or "default")
            report.write_json(json_path, meta, figures, worst_gap_ratio=ratio)
