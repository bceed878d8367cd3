"""Conversations: sessions, history -> prompt, the sessions store, and the engine driver."""
