"""Defaults of `bench serve` that its command line shows in --help (kept apart from the
bench's code, which loads only when a bench runs)."""

DEFAULT_SLO = "ttft=2000,tpot=100"  # what --compare llama-server's sustained rate keeps
CONCURRENCY = 64  # requests in flight at the server with --compare offline
