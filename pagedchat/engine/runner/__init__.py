"""The model side: runs a step over the paged KV cache and chooses the next tokens."""
