"""Rank 0 of a tensor-parallel group: starts the workers, sends each step once, runs its
own shard, and turns a dead worker into a clear error instead of a hang.

The engine process is rank 0: it keeps the one scheduler and block manager, broadcasts each
step's :class:`StepInput`, runs its shard like every worker, and alone gets the logits."""

from __future__ import annotations

import logging
import queue
import signal
import threading
import weakref
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pagedchat.engine.config import EngineConfig
from pagedchat.engine.errors import ModelLoadError, WorkerError
from pagedchat.engine.model_config import ModelConfig
from pagedchat.engine.parallel.tensor_parallel import COLLECTIVE_TIMEOUT, TensorParallel
from pagedchat.engine.parallel.worker import run_worker
from pagedchat.engine.runner.model_runner import ModelRunner
from pagedchat.engine.step_input import StepInput, StepOutput
from pagedchat.machine import usable_cores

log = logging.getLogger(__name__)
# Seconds to wait for the workers to load their shards before giving up.
LOAD_TIMEOUT = 600.0


class ParallelRunner:
    """Same interface as :class:`ModelRunner` (``execute``, ``timer``, ``num_blocks``...)."""

    def __init__(self, config: EngineConfig, model_config: ModelConfig) -> None:
        size = config.tensor_parallel_size
        cores = usable_cores()
        if size > cores:  # every collective then waits for a rank the system has set aside
            log.warning("tensor_parallel_size=%d on %d usable cores: the ranks take turns on "
                        "the cores and wait for each other at every layer, slower than one "
                        "process", size, cores)
        # The workers share this machine's cores: one share each, for torch and the kernel.
        self.threads = max(1, cores // size)
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        context = mp.get_context("spawn")
        ready = context.Queue()
        # Rank 0 serves the rendezvous store on a port the system picks.
        store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False,
                              timeout=COLLECTIVE_TIMEOUT)
        self.workers = [
            context.Process(target=run_worker, name=f"pagedchat-tp-rank{rank}", daemon=True,
                            args=(rank, size, store.port, config, model_config, self.threads,
                                  ready))
            for rank in range(1, size)]
        for process in self.workers:
            process.start()
        self.watchdog = Watchdog(self.workers)
        # However this object goes away (shutdown, error, GC), no worker outlives it.
        self._finalizer = weakref.finalize(self, self.watchdog.stop_workers)
        try:
            self.tp = TensorParallel(0, size)
            self.runner = ModelRunner(config, model_config, self.tp)
            self._wait_ready(ready)
            self.tp.connect(store, self.runner.device.type)
        except BaseException:
            self._finalizer()
            raise
        self.timer = self.runner.timer
        self.kernels = self.runner.kernels
        self.num_blocks = self.runner.num_blocks
        self.kv_dtype = self.runner.kv_dtype
        self.num_host_blocks = self.runner.num_host_blocks
        self.kv_groups = self.runner.kv_groups
        self.watchdog.start()

    def _wait_ready(self, ready) -> None:
        """Every worker has loaded its shard, or the one that could not is named."""
        pending = set(range(1, len(self.workers) + 1))
        waited = 0.0
        while pending:
            try:
                rank, error = ready.get(timeout=0.5)
            except queue.Empty:
                waited += 0.5
                for rank in pending:
                    process = self.workers[rank - 1]
                    if not process.is_alive():
                        raise ModelLoadError(
                            f"tensor-parallel worker rank {rank} {describe_exit(process.exitcode)}"
                            " while loading the model") from None
                if waited > LOAD_TIMEOUT:
                    raise ModelLoadError(
                        f"tensor-parallel workers {sorted(pending)} did not load the model "
                        f"within {LOAD_TIMEOUT:.0f} s") from None
                continue
            if error is not None:
                raise ModelLoadError(f"tensor-parallel worker rank {rank}: {error}")
            pending.discard(rank)

    @property
    def failure(self) -> str | None:
        return self.watchdog.failure

    def execute(self, step: StepInput) -> StepOutput:
        """Send the step to every worker, run rank 0's shard, return its StepOutput (the
        sampled rows' logits gathered over the workers, and the argmax rows' tokens)."""
        if self.failure:
            raise WorkerError(self.failure)
        try:
            with self.timer.phase("broadcast"):
                self.tp.broadcast(step)
            return self.runner.execute(step)
        except Exception as error:
            raise WorkerError(self.watchdog.explain(error)) from error

    def communication(self) -> dict[str, int]:
        """Tokens run and the bytes rank 0 all-reduced (activations) and broadcast (steps)."""
        return self.runner.communication()

    @property
    def weight_bytes(self) -> int:
        """Bytes of rank 0's shard of the weights."""
        return self.runner.weight_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one block in rank 0's pool (its heads)."""
        return self.runner.block_bytes

    def shutdown(self) -> None:
        """Tell the workers to stop, wait for them, and leave the group; safe to repeat."""
        if not self._finalizer.alive:
            return
        self.watchdog.closing.set()
        if not self.failure:
            try:
                self.tp.broadcast(None)
                for process in self.workers:
                    process.join(timeout=10)
            except Exception:  # a worker died meanwhile: the finalizer kills the rest
                pass
        self._finalizer()
        self.tp.close()
        torch.set_num_threads(self._threads_before)


class Watchdog:
    """Waits on the workers in a thread of its own: one that exits while the engine runs is a
    failure, recorded, and the others are stopped so that rank 0's pending collective fails
    at once. It holds no reference to the runner, so the runner can be collected."""

    def __init__(self, workers: list) -> None:
        self.workers = workers
        self.closing = threading.Event()
        self.failure: str | None = None
        self._thread = threading.Thread(target=self._watch, name="pagedchat-tp-watchdog",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        sentinels = {process.sentinel: rank for rank, process in enumerate(self.workers, 1)}
        while not self.closing.is_set():
            done = wait(list(sentinels), timeout=0.5)
            if not done or self.closing.is_set():
                continue
            rank = sentinels[done[0]]
            process = self.workers[rank - 1]
            process.join()
            self.failure = (f"tensor-parallel worker rank {rank} (pid {process.pid}) "
                            f"{describe_exit(process.exitcode)}; the engine has stopped")
            self.stop_workers()
            return

    def explain(self, error: Exception) -> str:
        """Name the worker behind a failed collective (the watchdog may need a moment)."""
        self._thread.join(timeout=5)
        if not self.failure:  # rank 0 itself failed mid-step: the group is out of step
            self.failure = f"tensor-parallel step failed on rank 0: {error}"
            self.stop_workers()
        return self.failure

    def stop_workers(self) -> None:
        self.closing.set()
        for process in self.workers:
            if process.is_alive():
                process.kill()
        for process in self.workers:
            process.join(timeout=5)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"
