"""`python -m specstruct` runs the command line (same as the `specstruct` script)."""

from specstruct.cli import app

if __name__ == "__main__":
    app(prog_name="specstruct")
