"""`pagedchat serve`: an OpenAI-compatible HTTP server on the paged engine."""
