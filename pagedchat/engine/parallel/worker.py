"""A tensor-parallel worker process (ranks 1..k-1): load a shard, then run every step
rank 0 broadcasts until it sends the stop message (None). It samples nothing and holds no
scheduler state: the step arrives as flat arrays (:class:`~pagedchat.engine.step_input.StepInput`)
and its logits go to rank 0 inside the model's gather."""

from __future__ import annotations

import sys

from pagedchat.engine.config import EngineConfig
from pagedchat.engine.model_config import ModelConfig


def run_worker(rank: int, size: int, store_port: int, config: EngineConfig,
               model_config: ModelConfig, threads: int, ready) -> None:
    """Entry point of a spawned worker: ``store_port`` is rank 0's TCPStore on this host;
    ``ready`` is a queue that gets ``(rank, error)``, error None once the shard is loaded."""
    import torch
    import torch.distributed as dist

    from pagedchat.engine.parallel.tensor_parallel import COLLECTIVE_TIMEOUT, TensorParallel
    from pagedchat.engine.runner.model_runner import ModelRunner

    torch.set_num_threads(threads)
    tp = TensorParallel(rank, size)
    try:
        runner = ModelRunner(config, model_config, tp)
    except Exception as error:  # reported by rank 0, naming this rank
        ready.put((rank, f"{type(error).__name__}: {error}"))
        sys.exit(1)
    ready.put((rank, None))
    try:
        store = dist.TCPStore("127.0.0.1", store_port, size, is_master=False,
                              timeout=COLLECTIVE_TIMEOUT)
        tp.connect(store, runner.device.type)
        while (step := tp.broadcast()) is not None:
            runner.execute(step)
    except Exception as error:  # rank 0 is gone or the group broke: nothing left to serve
        print(f"pagedchat tensor-parallel worker {rank}: {error}", file=sys.stderr)
        sys.exit(1)
    tp.close()
