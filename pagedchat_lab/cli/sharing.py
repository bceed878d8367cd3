"""`pagedchat bench sharing`: KV memory saved by sharing (the paper's Fig. 15)."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat.cli.options import user_errors
from pagedchat_lab.cli import options as opt


def sharing(num_requests: opt.NumRequests = 24, model: opt.Model = None,
            max_tokens: opt.MaxTokens = 128,
            widths: Annotated[str, typer.Option(
                "--widths", help="n for parallel sampling and beam widths, e.g. 2,4,6.")]
            = "2,4,6",
            seed: opt.Seed = 0, json_path: opt.JsonPath = None,
            tp: opt.TensorParallelSize = 1, weights: opt.Weights = None) -> None:
    """KV memory saved by sharing, parallel sampling and beam search (the paper's Fig. 15)."""
    from pagedchat_lab import report
    from pagedchat_lab.sharing import COLUMNS, measure_sharing
    from pagedchat_lab.suite import parse_list

    with user_errors():
        engine = opt.engine_options(model, opt.DType.float32.value, tp=tp, weights=weights).build()
        rows = measure_sharing(engine, num_requests, max_tokens, seed, parse_list(widths, int))
        report.emit_table("sharing", rows, COLUMNS)
        report.save(json_path, engine, {"pagedchat": rows})
