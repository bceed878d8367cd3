"""The Textual app of `pagedchat chat`."""
