"""pagedchat: a terminal chatbot on a from-scratch PagedAttention engine."""

from pagedchat.engine.llm import LLM
from pagedchat.engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"
