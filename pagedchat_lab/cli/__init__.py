"""`pagedchat bench ...`: one module per subcommand, registered here in the order `--help`
lists them.

Each bench builds pagedchat (and the peers asked for) on the same weights, samples its
workload from the ShareGPT trace, runs it, prints a table (``key=value`` lines when piped)
and, with ``--json``, writes the figures with the run's metadata.
"""

from __future__ import annotations

from pagedchat.cli.options import command_group
from pagedchat_lab.cli import (
    blocksize,
    chatbot,
    isolation,
    kv_cache,
    latency,
    memory,
    parallel,
    preemption,
    prefix,
    quality,
    regenerate,
    serve,
    sharing,
    speculative,
    synth_model,
    throughput,
    warm_start,
)

app = command_group("The paper's evaluation on this machine, peers side by side.")
app.command()(throughput.throughput)
app.command()(serve.serve)
app.command()(chatbot.chatbot)
app.command()(memory.memory)
app.command()(prefix.prefix)
app.command()(blocksize.blocksize)
app.command()(preemption.preemption)
app.command()(latency.latency)
app.command()(quality.quality)
app.command("kv-cache")(kv_cache.kv_cache)
app.command()(sharing.sharing)
app.command()(parallel.parallel)
app.command()(isolation.isolation)
app.command()(speculative.speculative)
app.command("synth-model")(synth_model.synth_model)
app.command()(regenerate.regenerate)
app.command("warm-start")(warm_start.warm_start)
