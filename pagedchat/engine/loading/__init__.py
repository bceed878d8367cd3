"""Reading a model's own files: weights, config, tokenizer."""
