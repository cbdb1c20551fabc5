"""recipes/speed/overview_plot.py: the README's picture from benchmark.py's decode.csv."""

import subprocess
import sys

import pytest
from conftest import clean_env

pytestmark = pytest.mark.slow  # every test here starts a command line or trains (docs/testing.md)

SCRIPT = ["-m", "recipes.speed.overview_plot"]
HEADER = "model,label,L,sources,beam,repeats,seconds,ms_per_step,bytes_per_hypothesis\n"


def plot(*args, cwd):
    return subprocess.run([sys.executable, *SCRIPT, *args], cwd=cwd, env=clean_env(MPLBACKEND="Agg"),
                          capture_output=True, text=True, timeout=120)


def coloured_share(models, tmp_path):
    """Share of the image's pixels in colour (the curves; axes and text are grey)."""
    import matplotlib.image

    rows = [f"{model},{model},{length},20,10,3,{length * slope},1.0,100\n"
            for model, slope in models for length in (10, 100)]
    (tmp_path / "decode.csv").write_text(HEADER + "".join(rows))
    result = plot("decode.csv", "overview.png", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rgb = matplotlib.image.imread(tmp_path / "overview.png")[..., :3]
    return float(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.3).mean())


def test_draws_the_shown_models_from_decode_csv(tmp_path):
    assert coloured_share([("k32", 0.01), ("att", 0.1), ("lstm_att", 0.3), ("k1", 0.01)], tmp_path) > 0.002
    assert coloured_share([("k1", 0.01)], tmp_path) < 0.0005  # a model it does not show: no curve


def test_empty_csv_is_a_one_line_error(tmp_path):
    (tmp_path / "decode.csv").write_text(HEADER)
    result = plot("decode.csv", "overview.png", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith(
        "error: no rows in decode.csv (run recipes.speed.benchmark first)")
    assert not (tmp_path / "overview.png").exists()
