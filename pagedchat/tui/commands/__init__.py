"""The slash commands; importing the handlers fills the table in /help's order."""

from pagedchat.tui.commands import handlers  # noqa: F401
from pagedchat.tui.commands.registry import COMMANDS, SlashCommand, parse, run_slash

__all__ = ["COMMANDS", "SlashCommand", "parse", "run_slash"]
