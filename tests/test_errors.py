"""Errors a user can fix end on one line that names the bad value and what to do, through the
real command lines (fairseq-train, -generate, -interactive, our fairseq-memattn-* tools) and the
hub, and nothing is written or lost on the way."""

import argparse
import hashlib
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import PLUGIN_DIR, REPO, clean_env, run_fairseq

from fairseq_memattn.errors import UserError
from fairseq_memattn.models.lstm_memattn import MemAttnLSTMModel
from fairseq_memattn.models.transformer_memattn import MemAttnTransformerModel

TASK = ["--user-dir", PLUGIN_DIR, "--task", "copy_task", "--copy-max-len", "6", "--copy-vocab-size", "8",
        "--copy-train-size", "64", "--copy-valid-size", "16", "--copy-test-size", "16"]
LSTM = ["--arch", "lstm_memattn", "--encoder-embed-dim", "8", "--decoder-embed-dim", "8",
        "--encoder-hidden-size", "8", "--decoder-hidden-size", "16", "--memory-k", "4",
        "--memory-position-encoding"]
TRANSFORMER = ["--arch", "transformer_memattn", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
               "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-layers", "1",
               "--decoder-layers", "1", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
               "--memory-k", "4"]
TRAIN = ["--optimizer", "adam", "--lr", "1e-3", "--batch-size", "16", "--max-update", "2", "--cpu",
         "--no-progress-bar", "--seed", "1", "--num-workers", "0"]


def last_line(result):
    """The line a failed command ends on."""
    assert result.returncode != 0, "expected the command to fail"
    return result.stderr.strip().splitlines()[-1]


def contents(directory):
    """Every file under ``directory`` with a hash of its bytes."""
    return {os.path.relpath(os.path.join(root, name), directory):
            hashlib.sha256(open(os.path.join(root, name), "rb").read()).hexdigest()
            for root, _, names in os.walk(directory) for name in names}


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    """A tiny lstm_memattn trained by fairseq-train: K = 4, position encodings with S = 7 (the
    longest training source, 6 tokens and EOS)."""
    save_dir = tmp_path_factory.mktemp("errors") / "lstm"
    run_fairseq("fairseq-train", *TASK, *LSTM, *TRAIN, "--save-dir", str(save_dir))
    assert torch.load(save_dir / "checkpoint_last.pt", weights_only=True)["cfg"]["model"].memory_position_max_len == 7
    return save_dir


@pytest.fixture(scope="module")
def transformer_dir(tmp_path_factory):
    """A tiny transformer_memattn trained by fairseq-train: K = 4, the attention read."""
    save_dir = tmp_path_factory.mktemp("errors") / "transformer"
    run_fairseq("fairseq-train", *TASK, *TRANSFORMER, *TRAIN, "--save-dir", str(save_dir))
    return save_dir


def with_option(command, option, value):
    """command with option's value replaced (or the option added)."""
    if option not in command:
        return [*command, option, value]
    i = command.index(option) + 1
    return [*command[:i], value, *command[i + 1:]]


def python_m(module, *args, cwd=None):
    return subprocess.run([sys.executable, "-m", module, *args], env=clean_env(), cwd=cwd,
                          capture_output=True, text=True, timeout=600)


# --- option values: argparse, before anything runs ---------------------------------

@pytest.mark.parametrize("arch, option, value, allowed", [
    ("lstm_memattn", "--memory-k", "0", "invalid value 0 (must be an integer >= 1)"),
    ("transformer_memattn", "--memory-k", "-3", "invalid value -3 (must be an integer >= 1)"),
    ("transformer_memattn", "--memory-position-max-len", "0", "invalid value 0 (must be an integer >= 1)"),
    ("lstm_memattn", "--encoder-layers", "x", "invalid value 'x' (must be an integer >= 1)"),
    ("lstm_memattn", "--dropout", "1.5", "invalid value 1.5 (must be a number in [0, 1))"),
    ("lstm_memattn", "--copy-vocab-size", "0", "invalid value 0 (must be an integer >= 1)"),
    ("lstm_memattn", "--memory-encoder-score", "relu", "invalid choice: 'relu' (choose from 'softmax', 'sigmoid')"),
])
def test_bad_option_value_stops_in_argparse(tmp_path, arch, option, value, allowed):
    save_dir = tmp_path / "checkpoints"
    result = run_fairseq("fairseq-train", *TASK, "--arch", arch, option, value, *TRAIN,
                         "--save-dir", str(save_dir), check=False)
    assert result.returncode == 2
    assert last_line(result) == f"fairseq-train: error: argument {option}: {allowed}"
    assert "Traceback" not in result.stderr
    assert "fairseq_cli.train" not in result.stdout + result.stderr  # train.main never started
    assert not save_dir.exists()


def test_option_combination_the_model_cannot_honour_is_one_line(tmp_path):
    """Checked when the model is built (it needs several options): our message, no traceback,
    unless FAIRSEQ_MEMATTN_TRACEBACK asks for it."""
    command = [*TASK, "--arch", "transformer_memattn", "--cross-self-attention", *TRAIN,
               "--save-dir", str(tmp_path / "checkpoints")]
    result = run_fairseq("fairseq-train", *command, check=False)
    assert last_line(result).startswith("fairseq-train: error: --cross-self-attention attends to the "
                                        "encoder states at every step")
    assert "Traceback" not in result.stderr
    debug = subprocess.run([os.path.join(os.path.dirname(sys.executable), "fairseq-train"), *command],
                           env=clean_env(FAIRSEQ_MEMATTN_TRACEBACK="1"), capture_output=True, text=True,
                           timeout=600)
    assert "Traceback" in debug.stderr and "Error: --cross-self-attention" in last_line(debug)


def own_options(model_class, base=None):
    """The options model_class.add_args adds (beyond base.add_args)."""
    def actions(cls):
        parser = argparse.ArgumentParser()
        cls.add_args(parser)
        return {a.option_strings[0]: a for a in parser._actions if a.option_strings and a.dest != "help"}

    added = actions(model_class)
    return {name: a for name, a in added.items() if base is None or name not in actions(base)}


def test_every_plugin_option_has_help_text():
    from fairseq.models.transformer import TransformerModel

    from fairseq_memattn.tasks.copy_task import CopyTaskConfig

    options = {**own_options(MemAttnLSTMModel), **own_options(MemAttnTransformerModel, TransformerModel)}
    assert {"--memory-encoder-score", "--attention-type", "--memory-read", "--encoder-layers"} <= set(options)
    assert [name for name, action in options.items() if not action.help] == []
    assert [name for name, field in CopyTaskConfig.__dataclass_fields__.items()
            if not name.startswith("_") and not field.metadata.get("help")] == []


# --- checkpoints -------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["lstm", "transformer"])
def test_misfit_through_model_overrides_names_the_override(checkpoint_dir, transformer_dir, arch):
    saved = checkpoint_dir if arch == "lstm" else transformer_dir
    path = saved / "checkpoint_last.pt"
    before = contents(saved)
    result = run_fairseq("fairseq-generate", *TASK, "--path", str(path), "--gen-subset", "test", "--cpu",
                         "--model-overrides", "{'memory_k': 8}", check=False)
    assert last_line(result) == (
        f"fairseq-generate: error: {path} does not fit the model: checkpoint has memory_k=4 but the "
        "model was built with memory_k=8; --model-overrides sets memory_k: remove it from --model-overrides")
    assert "Traceback" not in result.stderr
    assert contents(saved) == before


@pytest.mark.parametrize("arch", ["lstm", "transformer"])
def test_misfit_when_training_resumes_names_the_command_line(checkpoint_dir, transformer_dir, tmp_path, arch):
    """fairseq-train with --save-dir holding a K = 4 checkpoint_last.pt and --memory-k 8: the
    model comes from the command line; the saved checkpoints stay as they were."""
    save_dir = tmp_path / "resume"
    shutil.copytree(checkpoint_dir if arch == "lstm" else transformer_dir, save_dir)
    before = contents(save_dir)
    model = with_option(LSTM if arch == "lstm" else TRANSFORMER, "--memory-k", "8")
    if arch == "transformer":
        model = with_option(model, "--memory-read", "mix")
    result = run_fairseq("fairseq-train", *TASK, *model, *TRAIN, "--save-dir", str(save_dir), check=False)
    differences = "checkpoint has memory_k=4 but the model was built with memory_k=8"
    fit = "--memory-k 4"
    if arch == "transformer":  # the window is on by default for the attention read only
        differences += ("; checkpoint has memory_position_window=True but the model was built with "
                        "memory_position_window=False; checkpoint has memory_read=attention but the model "
                        "was built with memory_read=mix")
        fit += ", --memory-position-window, --memory-read attention"
    assert last_line(result) == (
        f"fairseq-train: error: {save_dir / 'checkpoint_last.pt'} does not fit the model: {differences}; "
        f"the model is built from this command line: to continue training the checkpoint give {fit}; "
        "to train a new model use another --save-dir")
    assert "Cannot load model parameters" not in result.stderr and "Traceback" not in result.stderr
    assert contents(save_dir) == before


@pytest.mark.parametrize("kind", ["random bytes", "text", "a tensor"])
def test_a_file_that_is_not_a_checkpoint_says_so(tmp_path, kind):
    path = tmp_path / "model.pt"
    if kind == "random bytes":
        # seeded: bytes that start with pickle's PROTO opcode (0x80) draw a warning from torch's loader
        path.write_bytes(bytes([0x42]) + random.Random(0).randbytes(999))
    elif kind == "text":
        path.write_text("not a checkpoint\n")
    else:
        torch.save(torch.zeros(3), path)
    before = contents(tmp_path)
    result = run_fairseq("fairseq-generate", *TASK, "--path", str(path), "--cpu", check=False)
    what = ("torch.load gives a Tensor, not the dict of a fairseq save" if kind == "a tensor" else
            "not a file torch.save writes: neither a zip archive nor a legacy torch pickle")
    assert last_line(result) == (
        f"fairseq-generate: error: {path} is not a fairseq checkpoint ({what}): give the .pt file "
        "fairseq-train saved (checkpoint_best.pt, checkpoint_last.pt, checkpointN.pt, ...)")
    assert "Traceback" not in result.stderr and "weights_only" not in result.stderr
    assert contents(tmp_path) == before


@pytest.mark.parametrize("command", ["fairseq-generate", "python -m fairseq_cli.generate"])
def test_missing_checkpoint_is_one_line(tmp_path, command):
    """fairseq's command line loading the plugin through --user-dir, as a console script or with -m."""
    args = [*TASK, "--path", str(tmp_path / "nope.pt"), "--cpu"]
    if command == "fairseq-generate":
        result, prog = run_fairseq("fairseq-generate", *args, check=False), "fairseq-generate"
    else:
        result, prog = python_m("fairseq_cli.generate", *args), "generate.py"
    assert last_line(result) == f"{prog}: error: checkpoint not found: {tmp_path / 'nope.pt'}"
    assert "Traceback" not in result.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("holds", [["checkpoint_last.pt", "checkpoint_best.pt", "notes.txt"], []])
def test_a_folder_given_as_the_checkpoint_is_one_line(tmp_path, holds):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in holds:
        (folder / name).write_text("")
    result = run_fairseq("fairseq-generate", *TASK, "--path", str(folder), "--cpu", check=False)
    assert last_line(result) == "fairseq-generate: error: " + (
        f"{folder} is a folder: give a checkpoint file in it (checkpoint_best.pt, checkpoint_last.pt)" if holds else
        f"{folder} is a folder with no .pt file: give a checkpoint file (checkpoint_best.pt, checkpoint_last.pt, "
        "... in fairseq-train's --save-dir)")
    assert "Traceback" not in result.stderr


# --- sources longer than the position encodings' S ----------------------------------

TOO_LONG = ("has 13 tokens (EOS included), more than the S = 7 that the model's position encodings "
            "cover (Eq. 10: --memory-position-max-len 7, fixed when the model was trained; train with a "
            "larger one for longer sources): shorten or split it")


def test_source_longer_than_S_names_the_option_in_generate_and_interactive(checkpoint_dir, tmp_path):
    path = str(checkpoint_dir / "checkpoint_last.pt")
    longer = [value if value != "6" else "12" for value in TASK]  # test sources up to 12 tokens
    generate = run_fairseq("fairseq-generate", *longer, "--path", path, "--gen-subset", "test",
                           "--cpu", check=False)
    last = last_line(generate)
    assert last.startswith("fairseq-generate: error: source #") and "--memory-position-max-len 7" in last
    assert last.endswith("shorten or split it, or skip such sources with --skip-invalid-size-inputs-valid-test")
    interactive = run_fairseq("fairseq-interactive", *TASK, "--path", path, "--cpu",
                              stdin="1 2 3 4 5 6 7 1 2 3 4 5\n", check=False)
    assert last_line(interactive) == (f"fairseq-interactive: error: source #0 {TOO_LONG}, or skip such "
                                      "sources with --skip-invalid-size-inputs-valid-test")
    assert "Traceback" not in generate.stderr + interactive.stderr


def test_source_longer_than_S_names_the_option_in_the_hub(checkpoint_dir):
    hub = MemAttnLSTMModel.from_pretrained(
        str(checkpoint_dir), "checkpoint_last.pt", ".", task="copy_task", copy_max_len=6, copy_vocab_size=8,
        copy_train_size=64, copy_valid_size=16, copy_test_size=16)
    assert isinstance(hub.translate("1 2 3"), str)
    with pytest.raises(UserError) as error:
        hub.translate(["1 2", "1 2 3 4 5 6 7 1 2 3 4 5"])
    assert str(error.value) == f"sentence 1 {TOO_LONG}"
    # fairseq's own way out still works: the long source is skipped
    assert hub.generate([hub.encode("1 2 3 4 5 6 7 1 2 3 4 5")], skip_invalid_size_inputs=True) == []


# --- our command lines -------------------------------------------------------------

def test_our_command_lines_give_one_line_errors(checkpoint_dir, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cases = [
        (["fairseq-memattn-score", "missing.txt"],
         "fairseq-memattn-score: error: missing.txt: No such file or directory"),
        (["fairseq-memattn-score", str(tmp_path)],
         f"fairseq-memattn-score: error: {tmp_path}: Is a directory"),
        (["fairseq_memattn.tasks.copy_task", "--out-dir", str(blocker / "out")],
         f"copy_task.py: error: --out-dir {blocker / 'out'}: Not a directory"),
        (["fairseq-memattn-plot", "--user-dir", PLUGIN_DIR, "--task", "translation", str(tmp_path / "data"),
          "--path", str(checkpoint_dir / "checkpoint_last.pt"), "--example-id", "0", "-o", "x.png"],
         f"fairseq-memattn-plot: error: {tmp_path / 'data'}: No such file or directory"),
        (["recipes.wmt17.run", "evaluate", "en-de", "missing.pt"],
         "wmt17: error: checkpoint missing.pt does not exist"),
    ]
    for args, expected in cases:
        if args[0].startswith("fairseq-memattn-"):  # a console script
            result = subprocess.run([os.path.join(os.path.dirname(sys.executable), args[0]), *args[1:]],
                                    env=clean_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600)
        else:
            result = python_m(*args, cwd=tmp_path)
        assert last_line(result) == expected, result.stderr[-2000:]
        assert "Traceback" not in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["a_file"]
