"""Our own transformer implementations (the Llama family)."""
