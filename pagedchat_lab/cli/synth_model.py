"""`pagedchat bench synth-model`: write (once) a random-weight Llama GGUF and print its path,
for `bench latency --model PATH`."""

from __future__ import annotations

from typing import Annotated

import typer

from pagedchat import console
from pagedchat.cli.options import user_errors


def synth_model(
    size: Annotated[str, typer.Option("--size", help="1.5b, or tiny (for tests).")] = "1.5b",
    quant: Annotated[str, typer.Option(
        "--quant", help="GGML type of the matrices: one the gguf package can quantize to "
                        "(Q8_0, Q4_0, ...).")] = "Q8_0",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random weights.")] = 0,
) -> None:
    """A random-weight Llama GGUF with the default model's tokenizer, in the cache folder:
    decode speed against the bytes read per token on a bigger model, nothing downloaded."""
    from pagedchat_lab.synthetic_gguf import synthetic_model, synthetic_path

    with user_errors():
        if not synthetic_path(size, quant, seed).is_file():
            console.note(f"writing the {size} model ({quant}, seed {seed}), once; a big one "
                         "takes minutes")
        path, found = synthetic_model(size, quant, seed)
        console.note(f"{'found' if found else 'wrote'} {path} "
                     f"({path.stat().st_size / 1e9:.2f} GB); run: pagedchat bench latency "
                     f"--model {path} --compare llama.cpp")
        typer.echo(path)
