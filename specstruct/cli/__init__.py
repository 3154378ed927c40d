"""The `specstruct` command line (typer). Importing this package must stay cheap: no torch until a command runs."""

from specstruct.cli.commands import app
from specstruct.cli.serve import serve

app.command(help=serve.__doc__)(serve)

__all__ = ["app"]
