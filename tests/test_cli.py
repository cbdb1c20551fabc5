"""End to end through fairseq's real command lines: train memory attention on a
tiny copy task until it copies, then decode with beam search and alignments,
validate and translate interactively, all loading the checkpoint with torch's
weights_only protection on and no environment variable."""

import os
import re

import pytest
from conftest import PLUGIN_DIR, check_copies
from conftest import run_fairseq as run

from fairseq_memattn.score import read_generate_output, score

pytestmark = pytest.mark.slow  # every test here starts a command line or trains (docs/testing.md)

TASK = ["--task", "copy_task", "--copy-max-len", "8", "--copy-vocab-size", "10",
        "--copy-train-size", "4000", "--copy-valid-size", "100", "--copy-test-size", "100"]
# Sigmoid scores on both sides (Sec. 4.2) converge fastest here; softmax/softmax at lr 1e-2 and
# 1,250 updates ranged from BLEU 33.6 to 99.1 over seeds 1-6.
MODEL = ["--arch", "lstm_memattn", "--memory-k", "8", "--encoder-hidden-size", "64",
         "--decoder-hidden-size", "64", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--dropout", "0", "--memory-encoder-score", "sigmoid", "--memory-decoder-score", "sigmoid"]
TRAIN = ["--optimizer", "adam", "--lr", "5e-3", "--clip-norm", "1", "--batch-size", "32",
         "--max-epoch", "20", "--seed", "1", "--cpu", "--no-progress-bar", "--no-epoch-checkpoints"]
# Another machine (CPU, thread count, BLAS) ends training like another seed: the thresholds belong
# below the worst of `python tests/measure_trained.py cli --seeds 1 2 3 4 5 --threads 1 2 --out DIR`.
# Measured (docs/testing.md), seeds 1-5 x OMP_NUM_THREADS 1 and 2 (2 threads gave the same numbers
# as 1 for every seed): BLEU 88.37 / 92.82 / 97.83 (min / median / max), accuracy 88.0 / 94.0 /
# 98.0, valid loss 0.016 / 0.093 / 0.094; interactive copied in all 10 runs.
MIN_BLEU, MIN_ACCURACY, MAX_VALID_LOSS = 75.0, 70.0, 0.5


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("copy")
    run("fairseq-train", "--user-dir", PLUGIN_DIR, *TASK, *MODEL, *TRAIN, "--save-dir", str(save_dir))
    return save_dir / "checkpoint_best.pt"


def generate(checkpoint, *extra, user_dir=PLUGIN_DIR, cwd=None):
    """fairseq-generate on the test split; --min-len 0 lets length-0 examples be decoded empty."""
    return run("fairseq-generate", "--user-dir", user_dir, *TASK, "--path", str(checkpoint),
               "--gen-subset", "test", "--beam", "5", "--batch-size", "32",
               "--required-batch-size-multiple", "1", "--cpu", "--min-len", "0", *extra, cwd=cwd)


def sources_and_hypotheses(out):
    """fairseq-generate's S- and H- lines: ({id: source}, {id: best hypothesis})."""
    return (dict(re.findall(r"^S-(\d+)\t(.*)$", out, re.M)),
            dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", out, re.M)))


def test_trained_model_copies_with_beam_search(checkpoint):
    out = generate(checkpoint, "--print-alignment").stdout
    assert re.search(r"^A-", out, re.M)
    check_copies(out, MIN_BLEU, MIN_ACCURACY, "end-to-end")


def test_empty_source_decodes_to_empty_output_with_min_len_0(checkpoint):
    """About 1 in L+1 copy examples is empty; with --min-len 0 the model ends them at once,
    and the scorer counts an empty hypothesis for an empty reference as exactly right.
    fairseq's default --min-len 1 forbids that output, and the task warns about it."""
    result = generate(checkpoint)
    sources, hypotheses = sources_and_hypotheses(result.stdout)
    empty = [i for i, source in sources.items() if source == ""]
    assert len(empty) >= 5  # 100 examples, lengths uniform in 0..8
    assert all(hypotheses[i] == "" for i in empty), {i: hypotheses[i] for i in empty}
    hyps, refs = read_generate_output(result.stdout.splitlines())  # in sample-id order
    pairs = dict(zip(sorted(sources, key=int), zip(hyps, refs)))
    assert all(pairs[i] == ("", "") for i in empty)
    assert score([h for h, _ in map(pairs.get, empty)], [""] * len(empty))["accuracy"] == 100.0
    assert "forbids the empty output" not in result.stderr

    forbidden = generate(checkpoint, "--min-len", "1")
    _, hypotheses = sources_and_hypotheses(forbidden.stdout)
    assert all(hypotheses[i] != "" for i in empty)  # the option is obeyed, not overridden
    assert ("--min-len 1 forbids the empty output, but length-0 copy examples (about 1 in 9 at "
            "--copy-max-len 8) have an empty target") in forbidden.stderr
    assert "pass --min-len 0" in forbidden.stderr


def test_every_test_example_is_decoded_whatever_the_batch_multiple(checkpoint):
    """fairseq drops a last batch that is not a multiple of --required-batch-size-multiple (8 by
    default): 100 examples in batches of 32 would lose the last 4. The copy task keeps them."""
    out = run("fairseq-generate", "--user-dir", PLUGIN_DIR, *TASK, "--path", str(checkpoint), "--gen-subset", "test",
              "--beam", "2", "--batch-size", "32", "--cpu", "--min-len", "0").stdout
    assert sorted(int(i) for i in re.findall(r"^H-(\d+)\t", out, re.M)) == list(range(100))


def test_validate_and_interactive_load_the_checkpoint(checkpoint):
    out = run("fairseq-validate", "--user-dir", PLUGIN_DIR, *TASK, "--path", str(checkpoint),
              "--valid-subset", "valid", "--batch-size", "32", "--cpu")
    out = out.stdout + out.stderr  # fairseq logs to stdout or stderr depending on the version
    loss = float(re.search(r"valid on 'valid' subset \| loss ([\d.]+)", out).group(1))
    assert loss < MAX_VALID_LOSS

    out = run("fairseq-interactive", "--user-dir", PLUGIN_DIR, *TASK, "--path", str(checkpoint),
              "--beam", "5", "--cpu", "--min-len", "0", stdin="3 1 4 1 5\n\n").stdout
    assert re.search(r"^H-0\t\S+\t3 1 4 1 5$", out, re.M), out
    assert re.search(r"^H-1\t\S+\t$", out, re.M), out  # the empty line: the empty output


def test_user_dir_by_name_when_installed(checkpoint, tmp_path):
    """`--user-dir fairseq_memattn` from any directory, as an installed package:
    fairseq then finds it beside itself in site-packages (a non-editable install,
    as .ci/run makes)."""
    import fairseq

    if not os.path.isdir(os.path.join(os.path.dirname(fairseq.__file__), "..", "fairseq_memattn")):
        pytest.skip("fairseq_memattn is not installed (non-editable) beside fairseq")
    out = generate(checkpoint, user_dir="fairseq_memattn", cwd=tmp_path).stdout
    assert read_generate_output(out.splitlines())[1]


def test_bad_option_is_reported_before_training(tmp_path):
    result = run("fairseq-train", "--user-dir", PLUGIN_DIR, *TASK, *MODEL[:2],
                 "--memory-k", "0", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8",
                 "--max-update", "1", "--cpu", "--save-dir", str(tmp_path), check=False)
    assert result.returncode != 0
    assert "argument --memory-k: invalid value 0 (must be an integer >= 1)" in result.stderr


HYDRA_MODELS = {
    "transformer_memattn": {"memory_k": 4, "encoder_layers": 1, "decoder_layers": 1, "encoder_embed_dim": 16,
                            "decoder_embed_dim": 16, "encoder_ffn_embed_dim": 32, "decoder_ffn_embed_dim": 32,
                            "encoder_attention_heads": 2, "decoder_attention_heads": 2},
    "lstm_memattn": {"memory_k": 4, "encoder_hidden_size": 16, "decoder_hidden_size": 16, "encoder_embed_dim": 16,
                     "decoder_embed_dim": 16},
}


def hydra_config(tmp_path, model):
    """fairseq-hydra-train's options for a copy-task run of MODEL's config, 3 updates into tmp_path."""
    import json

    task = {"_name": "copy_task", **{option[2:].replace("-", "_"): int(value)
                                     for option, value in zip(TASK[2::2], TASK[3::2])}}
    config = {"common": {"user_dir": PLUGIN_DIR, "cpu": True}, "task": task, "model": model,
              "criterion": {"_name": "cross_entropy"}, "optimizer": {"_name": "adam"},
              "lr_scheduler": {"_name": "fixed"}, "optimization": {"max_update": 3, "lr": [1e-3]},
              "dataset": {"batch_size": 32}, "checkpoint": {"save_dir": str(tmp_path / "checkpoints")}}
    (tmp_path / "run.yaml").write_text(json.dumps(config))  # YAML is a superset of JSON
    return ["--config-dir", str(tmp_path), "--config-name", "run", f"hydra.run.dir={tmp_path / 'hydra'}"]


def test_fairseq_hydra_train_reports_a_bad_option_in_one_line(tmp_path):
    """Hydra prints a job's exception under its own trimmed traceback; ours ends the command as
    fairseq-train's do, one argparse-style line and exit status 1."""
    result = run("fairseq-hydra-train", *hydra_config(tmp_path, {"_name": "lstm_memattn", "dropout": 1.5}),
                 check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "fairseq-hydra-train: error: invalid --dropout: 1.5 (must be in [0, 1))")


@pytest.mark.parametrize("arch", HYDRA_MODELS)
def test_fairseq_hydra_train_trains_resumes_and_its_checkpoint_decodes(arch, tmp_path):
    """fairseq-hydra-train hands the model a struct DictConfig, not fairseq-train's Namespace:
    the architecture's defaults must land in it (the checkpoint keeps them) and reach the model."""
    import torch

    save_dir = tmp_path / "checkpoints"
    train = hydra_config(tmp_path, {"_name": arch, **HYDRA_MODELS[arch]})
    run("fairseq-hydra-train", *train)
    resumed = run("fairseq-hydra-train", *train, "optimization.max_update=5")
    assert "Loaded checkpoint" in resumed.stdout + resumed.stderr

    saved = torch.load(save_dir / "checkpoint_last.pt", weights_only=False)["cfg"]["model"]
    assert saved["memory_k"] == 4 and saved["memory_encoder_score"]  # given, and filled in by the architecture
    out = run("fairseq-generate", "--user-dir", PLUGIN_DIR, *TASK, "--path", str(save_dir / "checkpoint_last.pt"),
              "--gen-subset", "test", "--beam", "2", "--batch-size", "32", "--required-batch-size-multiple", "1",
              "--cpu", "--min-len", "0").stdout
    assert len(read_generate_output(out.splitlines())[0]) == 100
