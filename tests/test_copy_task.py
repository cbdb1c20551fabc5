"""The copy task: determinism, length distribution, both data routes, scoring, bad input."""

import collections
import os
import subprocess
import sys

import pytest
from conftest import REPO, clean_env

from fairseq_memattn.errors import UserError
from fairseq_memattn.tasks.copy_task import CopyTask, CopyTaskConfig, copy_examples, export_copy_data
from fairseq_memattn.score import accuracy_by_length, read_generate_output, score

BIN = os.path.dirname(sys.executable)


def task_strings(cfg, split):
    """(source, target) strings of a split as --task copy_task serves them."""
    task = CopyTask.setup_task(cfg)
    task.load_dataset(split)
    dataset = task.dataset(split)
    d = task.source_dictionary
    return [(d.string(dataset[i]["source"][:-1]), d.string(dataset[i]["target"][:-1]))
            for i in range(len(dataset))]


@pytest.mark.slow
def test_same_examples_in_another_process():
    cfg = CopyTaskConfig(copy_max_len=7, copy_valid_size=50)
    code = ("from fairseq_memattn.tasks.copy_task import CopyTaskConfig, copy_examples;"
            "print(copy_examples(CopyTaskConfig(copy_max_len=7, copy_valid_size=50), 'valid'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": REPO}, timeout=300).stdout
    assert out.strip() == str(copy_examples(cfg, "valid"))
    assert copy_examples(cfg, "valid") != copy_examples(cfg, "test")  # splits differ
    assert copy_examples(CopyTaskConfig(copy_max_len=7, copy_valid_size=50, copy_seed=2), "valid") \
        != copy_examples(cfg, "valid")


def test_lengths_uniform_from_zero_to_L_and_symbols_in_vocabulary():
    cfg = CopyTaskConfig(copy_max_len=10, copy_vocab_size=5, copy_train_size=22_000)
    examples = copy_examples(cfg, "train")
    counts = collections.Counter(len(e) for e in examples)
    assert set(counts) == set(range(11))  # 0..L, length 0 included
    for length in range(11):
        assert abs(counts[length] - 2000) < 200, counts  # expected 2000 each; ~4.5 sigma
    assert {s for e in examples for s in e} == {"0", "1", "2", "3", "4"}


def test_targets_copy_or_reverse_and_end_with_eos():
    for reverse in (False, True):
        cfg = CopyTaskConfig(copy_max_len=6, copy_valid_size=30, copy_reverse=reverse)
        for src, tgt in task_strings(cfg, "valid"):
            assert tgt.split() == (src.split()[::-1] if reverse else src.split())
    task = CopyTask.setup_task(CopyTaskConfig(copy_max_len=6, copy_valid_size=30))
    task.load_dataset("valid")
    assert all(task.dataset("valid")[i]["source"][-1] == task.source_dictionary.eos() for i in range(30))


@pytest.mark.slow
def test_fairseq_preprocess_route_gives_identical_examples(tmp_path):
    cfg = CopyTaskConfig(copy_max_len=6, copy_train_size=200, copy_valid_size=40, copy_test_size=40)
    export_copy_data(cfg, str(tmp_path / "raw"))
    raw = tmp_path / "raw"
    subprocess.run([os.path.join(BIN, "fairseq-preprocess"), "--source-lang", "src", "--target-lang", "tgt",
                    "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
                    "--destdir", tmp_path / "bin", "--joined-dictionary", "--workers", "1"],
                   check=True, capture_output=True)
    from fairseq.tasks.translation import TranslationConfig, TranslationTask
    translation = TranslationTask.setup_task(TranslationConfig(data=str(tmp_path / "bin"),
                                                               source_lang="src", target_lang="tgt",
                                                               dataset_impl="mmap"))
    for split in ("train", "valid", "test"):
        translation.load_dataset(split)
        dataset = translation.dataset(split)
        d = translation.source_dictionary
        preprocessed = [(d.string(dataset[i]["source"][:-1]), d.string(dataset[i]["target"][:-1]))
                        for i in range(len(dataset))]
        assert preprocessed == task_strings(cfg, split)
        assert ("", "") in preprocessed  # length-0 examples survive as a lone EOS


@pytest.mark.parametrize("field, value, message", [
    ("copy_max_len", -1, "invalid --copy-max-len: -1 (must be >= 0)"),
    ("copy_vocab_size", 0, "invalid --copy-vocab-size: 0 (must be >= 1)"),
    ("copy_train_size", 0, "invalid --copy-train-size: 0 (must be >= 1)"),
    ("copy_test_size", -5, "invalid --copy-test-size: -5 (must be >= 1)"),
    ("copy_seed", -1, "invalid --copy-seed: -1 (must be >= 0)"),
    ("copy_max_len", 1024, "--copy-max-len 1024 makes examples of up to 1025 tokens (EOS included), more than "
                           "--max-source-positions 1024: raise --max-source-positions or lower --copy-max-len"),
])
def test_bad_task_options(field, value, message):
    with pytest.raises(ValueError) as error:
        CopyTask.setup_task(CopyTaskConfig(**{field: value}))
    assert message in str(error.value)


def test_unknown_split():
    task = CopyTask.setup_task(CopyTaskConfig(copy_max_len=3))
    with pytest.raises(ValueError, match=r"copy_task has no split 'dev' \(choose from train, valid, test\)"):
        task.load_dataset("dev")


@pytest.mark.slow
@pytest.mark.parametrize("option, value, minimum", [("--copy-vocab-size", "0", 1), ("--copy-seed", "-1", 0)])
def test_export_command_rejects_bad_values(tmp_path, option, value, minimum):
    result = subprocess.run([sys.executable, "-m", "fairseq_memattn.tasks.copy_task", "--out-dir", str(tmp_path),
                             option, value], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO},
                            timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"copy_task.py: error: argument {option}: invalid value {value} (must be an integer >= {minimum})")


@pytest.mark.slow
def test_export_command_runs_without_warnings(tmp_path):
    """The package imports the task before python -m runs the command, which runpy warns about
    when the command is the task's own module."""
    result = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "fairseq_memattn.tasks.copy_task",
                             "--out-dir", str(tmp_path), "--copy-max-len", "3", "--copy-train-size", "5",
                             "--copy-valid-size", "2", "--copy-test-size", "2"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": REPO}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Warning" not in result.stderr, result.stderr[-2000:]
    assert result.stdout == f"wrote train, valid, test to {tmp_path}\n"
    assert sorted(os.listdir(tmp_path)) == [f"{split}.{side}" for split in ("test", "train", "valid")
                                            for side in ("src", "tgt")]


def test_scoring_counts_length_zero_examples():
    lines = ["S-0\t", "T-0\t", "H-0\t-0.01\t", "S-1\t1 2 3", "T-1\t1 2 3", "H-1\t-0.2\t1 2 3",
             "S-2\t4 5", "T-2\t4 5", "H-2\t-0.3\t4", "D-2\t-0.3\t4"]
    hyps, refs = read_generate_output(lines)
    assert (hyps, refs) == (["", "1 2 3", "4"], ["", "1 2 3", "4 5"])
    result = score(hyps, refs)
    assert result["accuracy"] == pytest.approx(66.67) and result["sentences"] == 3
    assert score(["", "1 2 3 4"], ["", "1 2 3 4"])["bleu"] == 100.0
    # by reference length in bands of 2: lengths 0 and 1 | 2 and 3 (one short, one reordered) | 4
    bands = accuracy_by_length(["", "1 2 3", "4", "7", "6 5", "1 1 2 3"], ["", "1 2 3", "4 5", "7", "5 6", "1 2 1 3"], 2)
    assert bands == [{"lengths": "0-1", "exact": 2, "reordered": 0, "sentences": 2, "accuracy": 100.0},
                     {"lengths": "2-3", "exact": 1, "reordered": 1, "sentences": 3, "accuracy": 33.33},
                     {"lengths": "4-5", "exact": 0, "reordered": 1, "sentences": 1, "accuracy": 0.0}]
    with pytest.raises(ValueError, match="band width 0"):
        accuracy_by_length(hyps, refs, 0)
    with pytest.raises(ValueError, match="1 references have no hypothesis"):
        read_generate_output(["T-0\t1", "T-1\t2", "H-0\t-1\t1"])


# --required-batch-size-multiple: fairseq drops a last batch whose size is not a multiple of it (8 by
# default). Only the iterator fairseq-train trains on keeps it; the rest see every example.
TINY_MODEL = ["--arch", "lstm_memattn", "--encoder-embed-dim", "8", "--decoder-embed-dim", "8",
              "--encoder-hidden-size", "8", "--decoder-hidden-size", "8", "--encoder-layers", "1",
              "--decoder-layers", "1", "--memory-k", "4", "--optimizer", "adam", "--lr", "1e-3", "--cpu"]


def ids(iterator):
    return sorted(i for batch in iterator.frozen_batches for i in batch)


def trainer(*options):
    """fairseq's Trainer for the copy task with a tiny model, built in-process as fairseq-train does."""
    from fairseq import options as fairseq_options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    args = fairseq_options.parse_args_and_arch(fairseq_options.get_training_parser(), [
        "--task", "copy_task", "--copy-max-len", "6", "--copy-valid-size", "16", "--copy-test-size", "16",
        "--num-workers", "0", *TINY_MODEL, *options])
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion))


def test_decoding_and_validating_the_train_split_see_every_example():
    """fairseq-generate --gen-subset train and fairseq-validate --valid-subset train with --batch-size 5
    saw 60 of 64 examples: batches of 5, the last one (4) dropped for the default multiple of 8."""
    task = CopyTask.setup_task(CopyTaskConfig(copy_max_len=6, copy_train_size=64))
    task.load_dataset("train")
    # the keywords of fairseq_cli.generate and fairseq_cli.validate, with their defaults
    as_generate_and_validate = dict(max_tokens=None, max_sentences=5, max_positions=(1024, 1024),
                                    ignore_invalid_inputs=False, required_batch_size_multiple=8, seed=1,
                                    num_shards=1, shard_id=0, num_workers=1, data_buffer_size=10)
    iterator = task.get_batch_iterator(dataset=task.dataset("train"), **as_generate_and_validate)
    assert ids(iterator) == list(range(64))
    assert sorted(int(i) for batch in iterator.next_epoch_itr(shuffle=False) for i in batch["id"]) \
        == list(range(64))


def test_only_the_training_iterator_keeps_the_batch_multiple():
    """Batches of 5 and the default multiple of 8: training drops the last batch (4 examples), as
    fairseq's own tasks do."""
    training = trainer("--copy-train-size", "64", "--batch-size", "5").get_train_iterator(epoch=1)
    assert len(set(ids(training))) == 60 and len(training.frozen_batches) == 12


def test_a_train_split_the_batch_multiple_leaves_without_a_batch_is_refused():
    """--copy-train-size 5 in one batch of 8: fairseq dropped the lone batch (5 is not a multiple of 8)
    and stopped with "The dataset is empty", as its translation task does on a 5-pair train set.
    The copy task names both options."""
    run = trainer("--copy-train-size", "5", "--batch-size", "8")
    with pytest.raises(UserError) as error:
        run.get_train_iterator(epoch=1)
    assert str(error.value) == (
        "--copy-train-size 5 leaves fairseq-train no batch to train on: its 5 examples fit in one batch, and "
        "fairseq drops a last batch whose size is not a multiple of --required-batch-size-multiple 8: pass "
        "--required-batch-size-multiple 1, or a --copy-train-size that is a multiple of 8")
    assert ids(trainer("--copy-train-size", "5", "--batch-size", "8", "--required-batch-size-multiple", "1")
               .get_train_iterator(epoch=1)) == list(range(5))
    # a split in several batches keeps its first ones, as fairseq's own tasks do: no refusal
    assert len(ids(trainer("--copy-train-size", "5", "--batch-size", "2").get_train_iterator(epoch=1))) == 4


@pytest.mark.slow
def test_fairseq_train_refuses_a_train_split_without_a_batch_in_one_line(tmp_path):
    result = subprocess.run([os.path.join(BIN, "fairseq-train"), "--user-dir", os.path.join(REPO, "fairseq_memattn"),
                             "--task", "copy_task", "--copy-max-len", "6", "--copy-train-size", "5", *TINY_MODEL,
                             "--batch-size", "8", "--max-update", "2", "--no-save", "--save-dir", str(tmp_path)],
                            capture_output=True, text=True, env=clean_env(), cwd=tmp_path, timeout=600)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "fairseq-train: error: --copy-train-size 5 leaves fairseq-train no batch to train on: its 5 examples fit "
        "in one batch, and fairseq drops a last batch whose size is not a multiple of "
        "--required-batch-size-multiple 8: pass --required-batch-size-multiple 1, or a --copy-train-size that "
        "is a multiple of 8")
