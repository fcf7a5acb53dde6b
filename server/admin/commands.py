"""How an admin tool declares its sub-commands (``trireme transactions list``, ``trireme acls create``): one parser each, with the connection options."""
from __future__ import annotations

import argparse


def subcommands(parser: argparse.ArgumentParser, nested):
    """A ``command(name, run, text, aliases=(), **defaults)`` that adds a sub-command to ``parser``: its parser takes
    the connection options (``nested``), and ``run`` is what the tool calls for it."""
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")

    def command(name: str, run, text: str, aliases=(), **defaults) -> argparse.ArgumentParser:
        p = sub.add_parser(name, aliases=list(aliases), help=text, description=text)
        nested(p)
        p.set_defaults(run=run, **defaults)
        return p
    return command
