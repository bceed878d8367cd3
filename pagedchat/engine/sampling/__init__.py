"""Choosing tokens from a step's logits: sampling, log-probs, beam search, speculative
acceptance, and the text the chosen tokens make."""
