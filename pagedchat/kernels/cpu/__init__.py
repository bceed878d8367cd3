"""The CPU backend: compiled C kernels for paged attention (row by row for decodes and short
chunks, tiled for longer ones), the sampler's pass over the logits, a greedy head's screen,
RMSNorm, rotary-and-store and SiLU- and GELU-and-multiply (float32 and bfloat16), linear
layers on weights packed once into oneDNN's layout (:mod:`.linear`), a small decode batch
through all the layers in one call, the reference for everything else. The kernels are built
for the best instruction-set level the CPU runs (``PAGEDCHAT_CPU_ISA`` forces one; see
:mod:`.build`); without a C compiler the backend is the torch reference, after one warning."""

from pagedchat.kernels.cpu.attention import paged_attention, store_kv
from pagedchat.kernels.cpu.build import isa, kernel_library, prepare, set_isa
from pagedchat.kernels.cpu.decoder import LayerTensors, decoder_stack
from pagedchat.kernels.cpu.layer import gelu_tanh_mul, rms_norm, rotary_store, silu_mul
from pagedchat.kernels.cpu.linear import embedding, linear, pack_embedding, pack_linear
from pagedchat.kernels.cpu.quant import quantized_embedding, quantized_linear
from pagedchat.kernels.cpu.sampling import max_logsumexp, screen_candidates
from pagedchat.kernels.reference import copy_blocks, swap_blocks

__all__ = ["LayerTensors", "copy_blocks", "decoder_stack", "embedding", "gelu_tanh_mul", "isa",
           "kernel_library", "linear", "max_logsumexp", "pack_embedding", "pack_linear",
           "paged_attention", "prepare", "quantized_embedding", "quantized_linear", "rms_norm",
           "rotary_store", "screen_candidates", "set_isa", "silu_mul", "store_kv", "swap_blocks"]
