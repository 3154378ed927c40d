"""`python -m specstruct.bench`: the same command as `specstruct bench`."""

from .cli import app

if __name__ == "__main__":
    app(prog_name="python -m specstruct.bench")
