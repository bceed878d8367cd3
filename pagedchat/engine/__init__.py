"""The serving engine: paged KV cache, scheduler, model runner. No UI code."""
