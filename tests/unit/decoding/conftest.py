"""Fixtures shared by the decoding tests."""

import pytest


@pytest.fixture()
def engines():
    """Engines a test builds (append them): closed at its end, spill files and threads included."""
    made = []
    yield made
    for e in made:
        e.close()
