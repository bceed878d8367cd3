"""`python -m pagedchat.cli`: the same command as the `pagedchat` script."""

from pagedchat.cli import main

main()
