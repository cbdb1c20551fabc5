"""tests/mutate.py's mutations stay in step with the library: each finds the line it changes, once."""

import os

import pytest
from conftest import REPO
from mutate import MUTATIONS


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_mutation_finds_its_line_once(name):
    path, line = MUTATIONS[name][:2]
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
        assert f.read().count(line) == 1, f"{name}: {line!r} is not once in {path}"
