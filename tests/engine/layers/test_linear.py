"""Linear layers hold their weights in the layout the kernel backend reads."""

from __future__ import annotations

from pagedchat import LLM
from tests.engine.test_llm_engine import GREEDY, _prompts


def test_linear_weights_are_packed_once_for_the_backend(tiny_model_dir):
    """On the CPU backend every linear layer holds its weight in oneDNN's layout (where
    torch has oneDNN), the tied head too where the C product reads that layout (the
    embedding then reads its rows from it), and greedy output still matches the reference
    backend's."""
    from pagedchat.engine.layers.linear import Linear
    from pagedchat.kernels import cpu
    from pagedchat.kernels.cpu.linear import _onednn, blocked_width

    llm = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16)
    model = llm.engine.runner.model
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    assert layers and all(m.weight.is_mkldnn == _onednn() for m in layers)
    assert model.tied
    head = model.embed_tokens.weight
    assert head.is_mkldnn == (_onednn() and cpu.kernel_library() is not None)
    if head.is_mkldnn:
        assert blocked_width(head) is not None
    reference = LLM(model=str(tiny_model_dir), num_kv_blocks=64, block_size=16,
                    attention_backend="torch")
    assert not any(m.weight.is_mkldnn for m in reference.engine.runner.model.modules()
                   if isinstance(m, Linear))
    prompts = _prompts(3, seed=5)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert ours == [o.outputs[0].token_ids for o in reference.generate(prompts, GREEDY)]
