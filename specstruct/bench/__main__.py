"""`python -m specstruct.bench`: the same command as `specstruct bench`."""

from specstruct.bench.cli import app

if __name__ == "__main__":
    app(prog_name="python -m specstruct.bench")
