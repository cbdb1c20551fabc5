"""Reliability through fairseq's real command lines: untrusted checkpoints,
kill -9 and resume, checkpoints that do not fit their overrides, and bad data.

Every fairseq command line costs seconds of start-up on its own, so commands
that do not depend on each other run side by side (run_together)."""

import os
import re
import signal
import subprocess

import pytest
import torch
from conftest import BIN, PLUGIN_DIR, build_model, clean_env, make_dictionary

from fairseq_memattn.checkpoint_fit import loading, overrides_given_as
from fairseq_memattn.tasks.copy_task import CopyTask, CopyTaskConfig

ARCHITECTURES = ["lstm_memattn", "lstm_memattn_wmt", "lstm_att", "lstm_noatt", "lstm_linatt"]
TINY = ["--encoder-embed-dim", "8", "--decoder-embed-dim", "8", "--encoder-hidden-size", "8",
        "--decoder-hidden-size", "8", "--encoder-layers", "1", "--decoder-layers", "1"]
COPY = ["--user-dir", PLUGIN_DIR, "--task", "copy_task", "--copy-max-len", "6",
        "--copy-vocab-size", "8", "--copy-train-size", "800", "--copy-valid-size", "16",
        "--copy-test-size", "16"]
# No data-loading workers and a fixed seed (and OMP_NUM_THREADS=1 where runs are
# compared): two runs of the same command do exactly the same arithmetic.
TRAIN = ["--optimizer", "adam", "--lr", "1e-3", "--batch-size", "16", "--seed", "1", "--cpu",
         "--num-workers", "0", "--no-progress-bar"]
# Untrained models rarely stop by themselves: cap hypotheses at 12 tokens.
GENERATE = ["--cpu", "--beam", "2", "--batch-size", "8", "--required-batch-size-multiple", "1",
            "--max-len-a", "0", "--max-len-b", "12"]


def run_together(*commands, check=True):
    """Run fairseq command lines ((tool, *args) tuples) side by side."""
    processes = [subprocess.Popen([os.path.join(BIN, tool), *args], env=clean_env(OMP_NUM_THREADS="1"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for tool, *args in commands]
    results = []
    for (tool, *_), process in zip(commands, processes):
        stdout, stderr = process.communicate(timeout=600)
        if check:
            assert process.returncode == 0, f"{tool} failed:\n{stderr[-3000:]}"
        results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return results


def final_error(result):
    """The line a failed command ends on: its error, if it failed cleanly."""
    assert result.returncode != 0, "expected the command to fail"
    return result.stderr.strip().splitlines()[-1]


# --- checkpoints ---------------------------------------------------------------

@pytest.fixture(scope="module")
def arch_checkpoints(tmp_path_factory):
    """A real checkpoint of each architecture, two updates of fairseq-train."""
    root = tmp_path_factory.mktemp("archs")
    run_together(*[("fairseq-train", *COPY, "--arch", arch, *TINY, "--memory-k", "4", *TRAIN,
                    "--max-update", "2", "--save-dir", str(root / arch))
                   for arch in ARCHITECTURES])
    return {arch: root / arch / "checkpoint_last.pt" for arch in ARCHITECTURES}


class CodePayload:
    """Unpickling this runs exec(...), which writes ``marker``: what a
    malicious checkpoint would do with something worse than a file write."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('code from the checkpoint ran')",)


@pytest.fixture(scope="module")
def loads(arch_checkpoints, tmp_path_factory):
    """fairseq-generate on good, malicious, truncated and misfitted checkpoints,
    and fairseq-train --restore-file on the malicious one."""
    root = tmp_path_factory.mktemp("loads")
    memattn = arch_checkpoints["lstm_memattn"]
    state = torch.load(memattn, weights_only=True)
    marker = root / "code_ran"
    state["extra_state"]["payload"] = CodePayload(marker)
    malicious = root / "malicious.pt"
    torch.save(state, malicious)
    # Control: the file really runs its code when loaded without protection.
    torch.load(malicious, weights_only=False)
    assert marker.exists()
    marker.unlink()
    # What a kill during fairseq's copy to checkpoint_last.pt leaves behind.
    truncated = root / "checkpoint_last.pt"
    truncated.write_bytes(memattn.read_bytes()[: memattn.stat().st_size // 2])

    generate = ["fairseq-generate", *COPY, "--gen-subset", "test", *GENERATE, "--path"]
    ensemble = ":".join(str(arch_checkpoints[arch]) for arch in ARCHITECTURES)
    restore = ["fairseq-train", *COPY, "--arch", "lstm_memattn", *TINY, "--memory-k", "4", *TRAIN,
               "--max-update", "3", "--save-dir", str(root / "restored"), "--restore-file"]
    runs = run_together((*generate, ensemble), (*generate, str(malicious)),
                        (*restore, str(malicious)), (*generate, str(truncated)),
                        (*generate, str(memattn), "--model-overrides", "{'memory_k': 8}"),
                        check=False)
    return dict(zip(["ensemble", "malicious", "malicious restore", "truncated", "overrides"], runs),
                marker=marker, malicious_path=malicious, truncated_path=truncated)


@pytest.mark.slow
def test_every_architecture_loads_in_generate(arch_checkpoints, loads):
    """One fairseq-generate loads all five checkpoints (as an ensemble) and decodes."""
    assert loads["ensemble"].returncode == 0, loads["ensemble"].stderr[-3000:]
    assert len(re.findall(r"^H-\d+\t", loads["ensemble"].stdout, re.M)) == 16
    saved = {torch.load(path, weights_only=True)["cfg"]["model"].arch
             for path in arch_checkpoints.values()}
    assert saved == set(ARCHITECTURES)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["malicious", "malicious restore"])
def test_checkpoint_that_would_run_code_is_refused(loads, run):
    """By fairseq-generate --path and by fairseq-train --restore-file."""
    assert not loads["marker"].exists(), "loading the checkpoint ran code from it"
    prog = "fairseq-train" if run == "malicious restore" else "fairseq-generate"
    assert final_error(loads[run]) == (
        f"{prog}: error: refused to load {loads['malicious_path']}: its pickle calls exec, which is "
        "not among the types fairseq checkpoints hold (tensors, containers, argparse.Namespace, "
        "numpy scalars and numeric arrays). Unpickling it could run code from the file, so nothing in it was run. "
        "Load it with torch.load(..., weights_only=False) only if you trust where it came from.")
    assert "Traceback" not in loads[run].stderr


@pytest.mark.slow
def test_truncated_checkpoint_gets_a_clear_message(loads):
    assert final_error(loads["truncated"]).startswith(
        f"fairseq-generate: error: could not read {loads['truncated_path']} (")
    assert "resume from another checkpoint of the same save" in loads["truncated"].stderr
    assert "Traceback" not in loads["truncated"].stderr


@pytest.mark.slow
def test_overrides_that_do_not_fit_name_both_values(loads):
    assert final_error(loads["overrides"]).startswith("fairseq-generate: error: ")
    assert final_error(loads["overrides"]).endswith(
        " does not fit the model: checkpoint has memory_k=4 but the model was built with memory_k=8; "
        "--model-overrides sets memory_k: remove it from --model-overrides")


@pytest.mark.slow
def test_training_from_a_checkpoint_that_cannot_be_used_is_one_line(arch_checkpoints, tmp_path):
    """fairseq-train's --finetune-from-model and --restore-file: a checkpoint that does not fit gets the
    fine-tuning advice; a folder or a missing file is refused (fairseq trained from scratch)."""
    memattn = arch_checkpoints["lstm_memattn"]
    train = ["fairseq-train", *COPY, "--arch", "lstm_memattn", *TINY, "--memory-k", "4", *TRAIN, "--max-update", "1"]
    runs = run_together((*train, "--memory-k", "8", "--save-dir", str(tmp_path / "a"), "--finetune-from-model", str(memattn)),
                        (*train, "--save-dir", str(tmp_path / "b"), "--finetune-from-model", str(memattn.parent)),
                        (*train, "--save-dir", str(tmp_path / "c"), "--restore-file", str(tmp_path / "none.pt")),
                        check=False)
    assert [final_error(run) for run in runs] == [
        f"fairseq-train: error: {memattn} does not fit the model: checkpoint has memory_k=4 but the model was built "
        f"with memory_k=8; the model is built from this command line: to fine-tune the checkpoint give --memory-k 4",
        f"fairseq-train: error: {memattn.parent} is a folder: give a checkpoint file in it (checkpoint_best.pt, checkpoint_last.pt)",
        f"fairseq-train: error: checkpoint not found: {tmp_path / 'none.pt'}"]


@pytest.mark.parametrize("saved, built, message", [
    ({"memory_k": 3}, {"memory_k": 5}, "memory_k=3 but the model was built with memory_k=5"),
    ({}, {"attention_type": "additive"},
     "attention_type=memory but the model was built with attention_type=additive"),
    ({"attention_type": "additive", "attention_dim": 4}, {"attention_type": "additive"},
     "attention_dim=4 but the model was built with attention_dim=16"),
    ({"attention_type": "linear"}, {"attention_type": "gated_linear"},
     "attention_type=linear but the model was built with attention_type=gated_linear"),
    # Neither has parameters: told apart by the context the output layer reads (Eq. 3).
    ({"attention_type": "none"}, {"attention_type": "dot"},
     "attention_type=none but the model was built with attention_type=dot/scaled_dot"),
    ({"memory_position_window": True}, {}, "memory_position_window=True but the model was built with "
                                            "memory_position_window=False"),
    ({}, {"input_feeding": True}, "input_feeding=False but the model was built with input_feeding=True"),
    ({"attention_mix": True}, {}, "attention_mix=True but the model was built with attention_mix=False"),
    # The attention mix's input, not the output layer's, is wider than h_i by the context.
    ({"attention_type": "none", "attention_mix": True}, {"attention_type": "dot", "attention_mix": True},
     "attention_type=none but the model was built with attention_type=dot/scaled_dot"),
    ({}, {"encoder_layers": 1}, "encoder_layers=2 but the model was built with encoder_layers=1"),
    ({}, {"decoder_hidden_size": 32}, "decoder_hidden_size=16 but the model was built with decoder_hidden_size=32"),
    ({}, {"dictionary": make_dictionary(20)},
     "source vocabulary size=16 but the model was built with source vocabulary size=24"),
])
def test_misfit_is_reported_by_option(saved, built, message):
    checkpoint = build_model(**saved).state_dict()
    with pytest.raises(ValueError, match="checkpoint has " + re.escape(message)):
        build_model(**built).load_state_dict(checkpoint)


def test_saved_options_that_do_not_fit_their_weights_are_overridden_where_the_load_came_from():
    """A checkpoint whose saved options were edited: the command lines pass --model-overrides, the
    hub its keyword arguments."""
    checkpoint = build_model(memory_k=4).state_dict()
    model = build_model(memory_k=8)
    with pytest.raises(ValueError) as error, loading("saved", "checkpoint.pt"):
        model.load_state_dict(checkpoint)
    assert str(error.value).endswith("; the checkpoint's saved options do not match its weights: pass "
                                     "--model-overrides \"{'memory_k': 4}\"")
    with pytest.raises(ValueError) as error, loading("saved", "checkpoint.pt"), overrides_given_as("from_pretrained"):
        model.load_state_dict(checkpoint)
    assert str(error.value).endswith("; the checkpoint's saved options do not match its weights: pass "
                                     "memory_k=4 to from_pretrained")


def test_vocabulary_misfit_names_the_copy_tasks_option():
    """Loaded for the copy task, a dictionary of 16 (fairseq's 4 special symbols and 12 others) is
    --copy-vocab-size 12; for another task, the data directory's dictionaries."""
    checkpoint = build_model().state_dict()
    model = build_model(dictionary=make_dictionary(20))
    with pytest.raises(ValueError, match=re.escape("checkpoint.pt does not fit the model: ")) as error:
        with loading("train", "checkpoint.pt", task=CopyTask.setup_task(CopyTaskConfig(copy_vocab_size=16))):
            model.load_state_dict(checkpoint)
    assert str(error.value).endswith("to continue training the checkpoint give --copy-vocab-size 12; "
                                     "to train a new model use another --save-dir")
    with pytest.raises(ValueError) as error:
        model.load_state_dict(checkpoint)
    assert str(error.value).endswith("build the model with the dictionaries it was trained with (its data directory)")


def test_fitting_checkpoint_loads_exactly():
    checkpoint = build_model(seed=1, input_feeding=True, attention_mix=True).state_dict()
    model = build_model(seed=2, input_feeding=True, attention_mix=True)
    model.load_state_dict(checkpoint)
    assert all(torch.equal(checkpoint[name], value) for name, value in model.state_dict().items())


RESUME = [*COPY, "--arch", "lstm_memattn", *TINY, "--memory-k", "4", *TRAIN,
          "--max-update", "150", "--save-interval-updates", "10"]


@pytest.mark.slow
def test_kill_and_resume_equals_uninterrupted_run(tmp_path):
    """kill -9 mid-training, resume from checkpoint_last.pt: after the same
    number of updates the parameters and the optimizer state are bit for bit
    those of a run that was never interrupted (dropout 0.2 included: fairseq
    reseeds from --seed and the update number at every update)."""
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    env = clean_env(OMP_NUM_THREADS="1")
    with open(tmp_path / "straight.log", "w") as straight_log:
        uninterrupted = subprocess.Popen([os.path.join(BIN, "fairseq-train"), *RESUME,
                                          "--save-dir", str(straight)], env=env,
                                         stdout=straight_log, stderr=subprocess.STDOUT)
    killed = subprocess.Popen([os.path.join(BIN, "fairseq-train"), *RESUME,
                               "--save-dir", str(interrupted)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []
    for line in killed.stdout:  # kill it as soon as the first checkpoint is written
        log.append(line)
        if "Saved checkpoint" in line:
            os.kill(killed.pid, signal.SIGKILL)
            break
    log.extend(killed.stdout)
    assert killed.wait() == -signal.SIGKILL
    assert not any("done training" in line for line in log), "training finished before the kill"
    returncode = uninterrupted.wait(timeout=600)
    assert returncode == 0, (tmp_path / "straight.log").read_text()[-3000:]

    resumed = subprocess.run([os.path.join(BIN, "fairseq-train"), *RESUME,
                              "--save-dir", str(interrupted)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    loaded = re.search(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ (\d+) updates\)",
                       resumed.stdout)
    assert loaded and 10 <= int(loaded.group(1)) < 150, resumed.stdout[-3000:]
    print(f"killed, then resumed from update {loaded.group(1)} of 150")

    expected = torch.load(straight / "checkpoint_last.pt", weights_only=True)
    actual = torch.load(interrupted / "checkpoint_last.pt", weights_only=True)
    assert actual["optimizer_history"][-1]["num_updates"] == 150
    assert expected["optimizer_history"][-1]["num_updates"] == 150
    assert expected["model"].keys() == actual["model"].keys()
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][name]), name
    expected_adam = expected["last_optimizer_state"]["state"]
    actual_adam = actual["last_optimizer_state"]["state"]
    for key, moments in expected_adam.items():
        for name, value in moments.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(actual_adam[key][name]))
    for name in ("train_iterator", "val_loss", "best"):
        assert expected["extra_state"][name] == actual["extra_state"][name], name


# --- bad data: each case gets fairseq's documented behaviour or a clear error ----

# The position encodings cover fewer positions (S of Eq. 10) than --max-source-positions.
MAX_POSITIONS, POSITION_MAX_LEN = 24, 12
LONG = " ".join(["3"] * 20)  # 21 tokens with EOS: beyond S only
LONGER = " ".join(["4"] * 29)  # 30 tokens: beyond --max-source-positions too
TRAIN_PAIRS = [(" ".join(str((i * 7 + j) % 8) for j in range(1 + i % 6)),) * 2 for i in range(200)]
TRAIN_PAIRS += [("", "1 2"), ("3 4", ""), ("", ""), (LONG, LONG), (LONGER, LONGER)]
TEST_PAIRS = [("1 2 3", "1 2 3"), ("", ""), ("5 9 x 4", "5 9 x 4"), (LONG, LONG)]
# 100 updates (8 epochs) at lr 1e-2: enough for the loss to fall far below chance (4 bits: 16
# dictionary entries) and the targets' unigram entropy (3.08 bits), which no training that
# ignored the data, stalled or diverged on the empty lines would reach.
# Last epoch's loss, `python tests/measure_trained.py reliability`, seeds 1-5 x threads 1-2 (the
# 8-unit model computes the same with 1 and 2 threads): min 1.75, median 1.86, max 2.08.
BAD_DATA_UPDATES, MAX_FINAL_LOSS = 100, 2.6
BAD_DATA_TRAIN = ["--user-dir", PLUGIN_DIR, "--task", "translation", "--arch", "lstm_memattn", *TINY,
                  "--memory-k", "4", "--memory-position-encoding", *TRAIN, "--lr", "1e-2",
                  "--max-update", str(BAD_DATA_UPDATES), "--memory-position-max-len", str(POSITION_MAX_LEN),
                  "--max-source-positions", str(MAX_POSITIONS), "--max-target-positions", str(MAX_POSITIONS)]


def write_parallel(prefix, pairs, src_extra=()):
    for side, lines in (("src", [s for s, _ in pairs] + list(src_extra)), ("tgt", [t for _, t in pairs])):
        with open(f"{prefix}.{side}", "w") as f:
            f.writelines(line + "\n" for line in lines)


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory):
    """All bad-data runs, in three rounds of independent command lines."""
    root = tmp_path_factory.mktemp("bad_data")
    write_parallel(root / "train", TRAIN_PAIRS)
    write_parallel(root / "valid", TRAIN_PAIRS[:16])
    write_parallel(root / "test", TEST_PAIRS)
    write_parallel(root / "uneven", TRAIN_PAIRS[:4], src_extra=["7 7"])
    (root / "interactive.txt").write_text(f"1 2 zz\n\n{LONG}\n")
    data, uneven = root / "data-bin", root / "uneven-bin"
    preprocess = ["-s", "src", "-t", "tgt", "--joined-dictionary", "--workers", "1"]
    train = BAD_DATA_TRAIN
    runs = {}
    runs["preprocess"], runs["preprocess uneven"], runs["missing data-bin"] = run_together(
        ("fairseq-preprocess", *preprocess, "--trainpref", str(root / "train"),
         "--validpref", str(root / "valid"), "--testpref", str(root / "test"),
         "--destdir", str(data)),
        ("fairseq-preprocess", *preprocess, "--trainpref", str(root / "uneven"),
         "--destdir", str(uneven)),
        ("fairseq-train", str(root / "missing"), *train, "--save-dir", str(root / "ckpt-missing")),
        check=False)
    runs["train"], runs["train uneven"] = run_together(
        ("fairseq-train", str(data), *train, "--save-dir", str(root / "ckpt")),
        ("fairseq-train", str(uneven), *train, "--disable-validation",
         "--save-dir", str(root / "ckpt-uneven")),
        check=False)
    assert runs["train"].returncode == 0, runs["train"].stderr[-3000:]
    # The task's own limit is raised on purpose: the model's (from its checkpoint) still holds.
    generate = [str(data), "--user-dir", PLUGIN_DIR, "--task", "translation", "--path",
                str(root / "ckpt" / "checkpoint_last.pt"), *GENERATE,
                "--max-source-positions", "1000", "--max-target-positions", "1000"]
    runs["generate"], runs["generate skip"], runs["interactive"] = run_together(
        ("fairseq-generate", *generate),
        ("fairseq-generate", *generate, "--skip-invalid-size-inputs-valid-test"),
        ("fairseq-interactive", *generate, "--batch-size", "1", "--buffer-size", "1",
         "--input", str(root / "interactive.txt")),
        check=False)
    return runs


@pytest.mark.slow
def test_preprocess_keeps_empty_lines_and_maps_unknown_tokens(bad_data):
    log = bad_data["preprocess"].stderr
    assert bad_data["preprocess"].returncode == 0, log[-3000:]
    assert re.search(r"\[src\] \S+train\.src: 205 sents", log)  # the empty lines are kept
    unknown = re.search(r"\[src\] \S+test\.src: 4 sents, \d+ tokens, ([\d.]+)% replaced", log)
    assert float(unknown.group(1)) > 0  # "9" and "x" never occur in training


@pytest.mark.slow
def test_training_skips_too_long_pairs_and_trains_on_empty_lines(bad_data):
    """The source limit is the smaller of --max-source-positions and S."""
    log = bad_data["train"].stdout
    assert (f"2 samples have invalid sizes and will be skipped, max_positions="
            f"({POSITION_MAX_LEN}, {MAX_POSITIONS}), first few sample ids=[203, 204]") in log
    losses = [float(x) for x in re.findall(r"\| train \| epoch \d+ \| loss ([\d.]+)", log)]
    print("bad-data training loss per epoch:", losses)
    assert len(losses) == 8 and losses[-1] < MAX_FINAL_LOSS, losses


@pytest.mark.slow
def test_generate_refuses_too_long_source_naming_the_option(bad_data):
    """The model's limit (from its checkpoint: S of its position encodings)
    holds even though the task's limits were raised on the command line; the
    source never reaches the model."""
    assert final_error(bad_data["generate"]) == (
        f"fairseq-generate: error: source #3 has 21 tokens (EOS included), more than the "
        f"S = {POSITION_MAX_LEN} that the model's position encodings cover (Eq. 10: "
        f"--memory-position-max-len {POSITION_MAX_LEN}, fixed when the model was trained; train with a "
        "larger one for longer sources): shorten or split it, or skip such sources with "
        "--skip-invalid-size-inputs-valid-test")
    assert "position-encoding maximum" not in bad_data["generate"].stderr


@pytest.mark.slow
def test_generate_skips_too_long_and_decodes_empty_and_unknown(bad_data):
    result = bad_data["generate skip"]
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 samples have invalid sizes and will be skipped" in result.stderr
    sources = dict(re.findall(r"^S-(\d+)\t(.*)$", result.stdout, re.M))
    assert sources == {"0": "1 2 3", "1": "", "2": "5 <unk> <unk> 4"}
    assert sorted(re.findall(r"^H-(\d+)\t", result.stdout, re.M)) == ["0", "1", "2"]


@pytest.mark.slow
def test_interactive_maps_unknown_tokens_and_refuses_too_long(bad_data):
    result = bad_data["interactive"]
    assert re.search(r"^S-0\t1 2 <unk>$", result.stdout, re.M)
    assert re.search(r"^H-1\t", result.stdout, re.M)  # the empty line is translated too
    error = final_error(result)
    assert error.startswith("fairseq-interactive: error: source #0 has 21 tokens"), error
    assert f"--memory-position-max-len {POSITION_MAX_LEN}," in error


@pytest.mark.slow
def test_uneven_line_counts_fail_when_the_data_is_loaded(bad_data):
    """fairseq-preprocess binarizes each side on its own and accepts the files
    (its log shows the two counts); loading the pair stops with a clear error."""
    log = bad_data["preprocess uneven"].stderr
    assert bad_data["preprocess uneven"].returncode == 0
    assert re.search(r"uneven\.src: 5 sents", log) and re.search(r"uneven\.tgt: 4 sents", log)
    assert final_error(bad_data["train uneven"]) == (
        "AssertionError: Source and target must contain the same number of examples")


@pytest.mark.slow
def test_missing_data_directory(bad_data):
    assert re.fullmatch(r"FileNotFoundError: \[Errno 2\] No such file or directory: '\S+/missing'",
                        final_error(bad_data["missing data-bin"]))


@pytest.mark.parametrize("numpy_module", ["numpy.core", "numpy._core"])
def test_numpy_values_load_whichever_numpy_saved_them(tmp_path, numpy_module):
    """numpy 1 pickles its scalars and arrays from numpy.core, numpy 2 from numpy._core: a
    checkpoint of either loads under weights_only (here a BLEU kept as a numpy float, and counts)."""
    import numpy as np

    from fairseq_memattn.checkpoint_safety import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    saved = {"best": np.float64(12.5), "counts": np.arange(4, dtype=np.int64)}
    path = tmp_path / "checkpoint.pt"
    torch.save(saved, path, _use_new_zipfile_serialization=False)  # one plain pickle: its module names rewritable
    written = path.read_bytes()
    assert written.count(b"numpy._core.multiarray") == 2 or written.count(b"numpy.core.multiarray") == 2
    path.write_bytes(written.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
                     .replace(b"numpy.core.multiarray", numpy_module.encode() + b".multiarray"))
    loaded = torch.load(path, weights_only=True)
    assert loaded["best"] == 12.5 and loaded["counts"].tolist() == [0, 1, 2, 3]


def test_a_write_that_fails_leaves_the_file_as_it_was(tmp_path):
    """staging.replace_atomically (the converter's checkpoint, the plot's image): the old file
    stays whole and no partial file is left when the writer fails halfway."""
    from fairseq_memattn.staging import replace_atomically

    path = tmp_path / "sub" / "out.pt"

    def write(text):
        def writer(partial):
            assert os.path.dirname(partial) == str(path.parent) and partial.endswith(".pt")
            with open(partial, "w") as f:
                f.write(text)
            if text == "broken":
                raise KeyboardInterrupt
        return writer

    replace_atomically(str(path), write("first"))
    with pytest.raises(KeyboardInterrupt):
        replace_atomically(str(path), write("broken"))
    assert path.read_text() == "first" and os.listdir(path.parent) == ["out.pt"]
