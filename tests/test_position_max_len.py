"""S of the position encodings (Eq. 10) follows the training data when
--memory-position-max-len is not given, is kept in the checkpoint, and is
used as trained whatever data a later command reads; where the training data
cannot be read, the error says what to pass."""

import re

import pytest
import torch
from conftest import PLUGIN_DIR
from test_reliability import final_error, run_together, write_parallel

pytestmark = pytest.mark.slow  # every test here starts a command line or trains (docs/testing.md)

TINY = ["--encoder-embed-dim", "8", "--decoder-embed-dim", "8", "--encoder-hidden-size", "8",
        "--decoder-hidden-size", "8", "--encoder-layers", "1", "--decoder-layers", "1", "--memory-k", "4"]
TRAIN = ["--optimizer", "adam", "--lr", "1e-3", "--batch-size", "4", "--required-batch-size-multiple", "1",
         "--seed", "1", "--cpu",
         "--num-workers", "0", "--no-progress-bar", "--max-update", "1", "--disable-validation"]
# The longest source fairseq trains on has 9 words + EOS; the 20-word pair is
# beyond --max-source-positions 12 and skipped, so it does not count.
PAIRS = [("1 2 3", "1 2 3"), ("4 5 6 7 8 9 1 2 3", "4 5"), ("", ""), ("6 7", "6 7 8")]
TOO_LONG = (" ".join(["5"] * 20),) * 2
LONGEST_KEPT = 10
SMALL_S = 8  # below two training sources (10 and 21 tokens)
COPY_MAX_LEN = 6


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("position_max_len")
    write_parallel(root / "train", PAIRS + [TOO_LONG])
    write_parallel(root / "valid", PAIRS[:2])  # a source of 10 tokens
    data = root / "data-bin"
    run_together(("fairseq-preprocess", "-s", "src", "-t", "tgt", "--joined-dictionary",
                  "--workers", "1", "--trainpref", str(root / "train"), "--validpref", str(root / "valid"), "--destdir", str(data)))
    translation = [str(data), "--user-dir", PLUGIN_DIR, "--task", "translation",
                   "--arch", "lstm_memattn", "--memory-position-encoding", *TINY, *TRAIN,
                   "--max-source-positions", "12", "--max-target-positions", "12"]
    copy = ["--user-dir", PLUGIN_DIR, "--task", "copy_task", "--copy-max-len", str(COPY_MAX_LEN),
            "--copy-vocab-size", "8", "--copy-train-size", "50", "--arch", "lstm_memattn_wmt", *TINY, *TRAIN]
    results = run_together(
        ("fairseq-train", *translation, "--save-dir", str(root / "translation")),
        ("fairseq-train", *copy, "--save-dir", str(root / "copy")),
        ("fairseq-train", *translation, "--train-subset", "nosuch", "--save-dir", str(root / "missing")),
        ("fairseq-train", *[a for a in translation if a != "--disable-validation"], "--memory-position-max-len", str(SMALL_S),
         "--save-dir", str(root / "small_s")),
        check=False)
    return dict(zip(["translation", "copy", "missing", "small_s"], results),
                checkpoints={name: root / name / "checkpoint_last.pt" for name in ("translation", "copy")})


def saved_args(path):
    return torch.load(path, weights_only=True)["cfg"]["model"]


def test_translation_data_sets_s_and_the_checkpoint_keeps_it(runs):
    result = runs["translation"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert saved_args(runs["checkpoints"]["translation"]).memory_position_max_len == LONGEST_KEPT
    assert (f"position encodings (Eq. 10): S = {LONGEST_KEPT}, the longest source of the 'train' "
            f"split (EOS included)") in result.stdout + result.stderr


def test_copy_task_sets_s_and_decoding_keeps_the_trained_s(runs):
    """Loaded as fairseq-generate loads it, with other data (longer copy
    sequences), the model keeps the S it was trained with; fairseq's length
    filter then refuses what S does not cover."""
    from fairseq import checkpoint_utils

    import fairseq_memattn  # noqa: F401  (registers the task and model, as --user-dir does)

    assert runs["copy"].returncode == 0, runs["copy"].stderr[-3000:]
    path = str(runs["checkpoints"]["copy"])
    assert saved_args(path).memory_position_max_len == COPY_MAX_LEN + 1
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"copy_max_len": 3 * COPY_MAX_LEN})
    assert task.cfg.copy_max_len == 3 * COPY_MAX_LEN
    assert model.encoder.attention.writer.position_encoding_max_len == COPY_MAX_LEN + 1
    assert model.max_positions()[0] == COPY_MAX_LEN + 1


def test_unreadable_training_data_names_the_option(runs):
    error = final_error(runs["missing"])
    assert re.fullmatch(
        r"fairseq-train: error: --memory-position-encoding needs S of Eq\. 10, the longest source the model "
        r"trains on, and it could not be read from the training data of task TranslationTask "
        r"\(Dataset not found: nosuch \(\S+\)\): pass --memory-position-max-len S with the number of "
        r"tokens of your longest training source, EOS included \(fairseq-preprocess's binarized "
        r"length\), or --no-memory-position-encoding", error), error


def test_a_given_s_below_the_data_is_named_where_fairseq_skips_and_refuses(runs):
    """fairseq-train with --memory-position-max-len below some sources: the training pairs it
    skips and the validation source it refuses are reported under the option, not only as
    fairseq's max_positions=(8, ...)."""
    result = runs["small_s"]
    assert (f"2 of 5 sources are longer than the S = {SMALL_S} that the position encodings cover "
            f"(--memory-position-max-len {SMALL_S}) and are skipped") in result.stdout + result.stderr
    error = final_error(result)
    assert re.fullmatch(
        rf"fairseq-train: error: source #\d+ has \d+ tokens \(EOS included\), more than the S = {SMALL_S} that "
        rf"the model's position encodings cover \(Eq\. 10: --memory-position-max-len {SMALL_S}, .*\): shorten or "
        r"split it, or skip such sources with --skip-invalid-size-inputs-valid-test", error), error
