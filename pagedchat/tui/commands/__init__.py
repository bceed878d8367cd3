"""The slash commands, one module each; importing them fills the table in /help's order."""

from pagedchat.tui.commands import new, system, sampling, model, branch, clear, rename, export, help  # noqa: F401, I001, E501
from pagedchat.tui.commands.registry import COMMANDS, SlashCommand, parse, run_slash

__all__ = ["COMMANDS", "SlashCommand", "parse", "run_slash"]
