"""End to end through fairseq's real command lines: train memory attention on a
tiny copy task until it copies, then decode with beam search and alignments,
validate and translate interactively, all loading the checkpoint with torch's
weights_only protection on and no environment variable."""

import os
import re

import pytest
from conftest import PLUGIN_DIR, check_copies
from conftest import run_fairseq as run

from fairseq_memattn.score import read_generate_output

TASK = ["--task", "copy_task", "--copy-max-len", "8", "--copy-vocab-size", "10",
        "--copy-train-size", "4000", "--copy-valid-size", "100", "--copy-test-size", "100"]
MODEL = ["--arch", "lstm_memattn", "--memory-k", "8", "--encoder-hidden-size", "64",
         "--decoder-hidden-size", "64", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--dropout", "0"]
# Thresholds this tiny run reaches with margin (measured: see the closing note / README).
MIN_BLEU, MIN_ACCURACY = 85.0, 70.0  # measured: BLEU 96.8, accuracy 83.0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("copy")
    run("fairseq-train", "--user-dir", PLUGIN_DIR, *TASK, *MODEL,
        "--optimizer", "adam", "--lr", "1e-2", "--clip-norm", "1", "--batch-size", "32",
        "--max-epoch", "10", "--seed", "1", "--cpu", "--no-progress-bar",
        "--no-epoch-checkpoints", "--save-dir", str(save_dir))
    return save_dir / "checkpoint_best.pt"


def generate(checkpoint, *extra, user_dir=PLUGIN_DIR, cwd=None):
    return run("fairseq-generate", "--user-dir", user_dir, *TASK, "--path", str(checkpoint),
               "--gen-subset", "test", "--beam", "5", "--batch-size", "32",
               "--required-batch-size-multiple", "1", "--cpu", *extra, cwd=cwd).stdout


def test_trained_model_copies_with_beam_search(checkpoint):
    out = generate(checkpoint, "--print-alignment")
    assert re.search(r"^A-", out, re.M)
    check_copies(out, MIN_BLEU, MIN_ACCURACY, "end-to-end")


def test_validate_and_interactive_load_the_checkpoint(checkpoint):
    out = run("fairseq-validate", "--user-dir", PLUGIN_DIR, *TASK, "--path", str(checkpoint),
              "--valid-subset", "valid", "--batch-size", "32", "--cpu")
    out = out.stdout + out.stderr  # fairseq logs to stdout or stderr depending on the version
    loss = float(re.search(r"valid on 'valid' subset \| loss ([\d.]+)", out).group(1))
    assert loss < 1.0

    out = run("fairseq-interactive", "--user-dir", PLUGIN_DIR, *TASK, "--path", str(checkpoint),
              "--beam", "5", "--cpu", stdin="3 1 4 1 5\n").stdout
    assert re.search(r"^H-0\t\S+\t3 1 4 1 5$", out, re.M), out


def test_user_dir_by_name_when_installed(checkpoint, tmp_path):
    """`--user-dir fairseq_memattn` from any directory, as an installed package:
    fairseq then finds it beside itself in site-packages (a non-editable install,
    as .ci/run makes)."""
    import fairseq

    if not os.path.isdir(os.path.join(os.path.dirname(fairseq.__file__), "..", "fairseq_memattn")):
        pytest.skip("fairseq_memattn is not installed (non-editable) beside fairseq")
    out = generate(checkpoint, user_dir="fairseq_memattn", cwd=tmp_path)
    assert read_generate_output(out.splitlines())[1]


def test_bad_option_is_reported_before_training(tmp_path):
    result = run("fairseq-train", "--user-dir", PLUGIN_DIR, *TASK, *MODEL[:2],
                 "--memory-k", "0", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8",
                 "--max-update", "1", "--cpu", "--save-dir", str(tmp_path), check=False)
    assert result.returncode != 0
    assert "invalid --memory-k: 0 (must be an integer >= 1)" in result.stderr
