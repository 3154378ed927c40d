"""The `specstruct` command line (typer). Importing this package must stay cheap: no torch until a command runs."""

from specstruct.cli.commands import app

__all__ = ["app"]
