"""What tensor parallelism costs: bytes exchanged per token and per step, next to the
model's size, measured from the engine's own counters."""

from __future__ import annotations

from pagedchat.engine.llm_engine import LLMEngine
from pagedchat_lab.metrics import MB


def expected_bytes_per_token(engine: LLMEngine) -> int:
    """Megatron's count: two all-reduces per layer (attention out, MLP down) plus the
    embedding's, each one hidden vector per token, in the model's dtype."""
    model = engine.model_config
    element = 2 if engine.config.dtype in ("bfloat16", "float16") else 4
    return (2 * model.num_hidden_layers + 1) * model.hidden_size * element


def communication_figures(engine: LLMEngine) -> dict[str, float]:
    """Per token and per step, from the counters of rank 0 since the engine started."""
    counts = engine.runner.communication()
    tokens, steps = max(counts["tokens"], 1), max(counts["steps"], 1)
    return {
        "tensor_parallel_size": engine.config.tensor_parallel_size,
        "all_reduce_bytes_per_token": counts["bytes_all_reduced"] / tokens,
        "expected_all_reduce_bytes_per_token": (
            expected_bytes_per_token(engine) if engine.config.tensor_parallel_size > 1 else 0),
        "all_reduce_mb_per_step": counts["bytes_all_reduced"] / steps / MB,
        "broadcast_bytes_per_step": counts["bytes_broadcast"] / steps,
        "weights_per_worker_mb": engine.runner.weight_bytes / MB,
    }
