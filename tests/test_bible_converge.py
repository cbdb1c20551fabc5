"""recipes/bible/converge.py end to end on CPU at toy size: the GPU run's driver (smoke, the four
models side by side, decoding best and averaged checkpoints, the archive) and the report that scores
it here. After this passes, the GPU run can only fail because of the GPU."""

import subprocess
import sys
import tarfile

import pytest
from conftest import clean_env

from recipes.bible import converge

SCRIPT = ["-m", "recipes.bible.converge"]
# The recipe's models at toy width and depth (options both fairseq-train architectures take).
TOY_SIZES = "--encoder-embed-dim 32 --decoder-embed-dim 32 --encoder-layers 1 --decoder-layers 1"


def driver(*args, timeout=600):
    return subprocess.run([sys.executable, *SCRIPT, *args], env=clean_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_run_then_report(own_pair_recipe, tmp_path):
    data, bundle, out = own_pair_recipe["out"], tmp_path / "bundle", tmp_path / "out"
    assert driver("pack", "--data", str(data), "--bundle", str(bundle), "--no-wheels").returncode == 0
    # Batches of about 100 of the toy data's 2,000 sentences: 45 updates are 2-3 epochs, more than one
    # epoch checkpoint to average.
    ran = driver("run", "--bundle", str(bundle), "--out", str(out), "--work", str(tmp_path / "work"), "--cpu",
                 "--smoke-updates", "1", "--max-update", "60", "--minutes", "8", "--decode-minutes", "2",
                 "--train-args", "--max-tokens 1000 --batch-size 100 " + TOY_SIZES, "--generate-args", "--max-len-b 5")
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    with tarfile.open(out / converge.ARCHIVE) as tar:
        names = set(tar.getnames())
    for model in converge.MODELS:
        for name in ("command.txt", "train.log", "smoke.log", "best/hyp.test.fr", "best/hyp.valid.fr",
                     "average/hyp.test.fr", "average/hyp.valid.fr", "average/averaged.txt"):
            assert f"converged/{model}/{name}" in names
    assert not any(name.endswith(".pt") for name in names)  # checkpoints stay on the machine

    results = tmp_path / "results"
    reported = driver("report", str(out / converge.ARCHIVE), "--data", str(data), "--out", str(results))
    assert reported.returncode == 0, reported.stderr[-3000:]
    table = (results / "table.md").read_text()
    for model in converge.MODELS:
        row = next(line for line in table.splitlines() if line.startswith(f"| {model} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1:3] == ["--max-update", "60"] and int(cells[3]) >= 2
        assert cells[5] in ("best", "average") and float(cells[6]) >= 0 and float(cells[7]) >= 0
        assert float(cells[10]) > 0  # ms per output token
        assert (results / model / "best" / "generate.test.txt.gz").exists()
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in table and "nc:6|nw:0" in table  # BLEU and chrF signatures
    for baseline in converge.PAIRS:
        assert (results / f"curves_{baseline}.png").stat().st_size > 0


@pytest.mark.slow
def test_broken_environment_fails_in_the_smoke_step(own_pair_recipe, tmp_path):
    bundle = tmp_path / "bundle"
    converge.main(["pack", "--data", str(own_pair_recipe["out"]), "--bundle", str(bundle), "--no-wheels"])
    ran = driver("run", "--bundle", str(bundle), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"),
                 "--cpu", "--train-args", "--optimizer no_such_optimizer", timeout=300)
    assert ran.returncode == 1
    assert "smoke training failed" in ran.stdout and "training the four models" not in ran.stdout
    assert (tmp_path / "out" / converge.ARCHIVE).exists()  # the logs come back even so


def scored(valid_best, valid_average):
    return {"checkpoints": {"best": {"valid": {"bleu": valid_best}},
                            "average": {"valid": {"bleu": valid_average}}}}


def test_averaged_checkpoint_only_where_it_helps_both_models_of_a_pair():
    both = {"transformer": scored(10, 11), "transformer_memattn": scored(9, 9.5)}
    one = {"transformer": scored(10, 11), "transformer_memattn": scored(9, 8.5)}
    assert converge.chosen_checkpoint(both, "transformer", "transformer_memattn") == "average"
    assert converge.chosen_checkpoint(one, "transformer", "transformer_memattn") == "best"


def test_a_run_that_aborts_after_done_training_counts_as_trained(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("x | INFO | fairseq_cli.train | done training in 0.3 seconds\n"
                   "terminate called without an active exception\n")
    assert converge.trained(0, log) and converge.trained(134, log) and converge.trained(-6, log)
    log.write_text("x | INFO | fairseq_cli.train | done training in 0.3 seconds\nKilled\n")
    assert not converge.trained(1, log) and not converge.trained(-9, log)  # only that abort counts
    log.write_text("x | INFO | train | epoch 001 | loss 4.5\nTraceback (most recent call last):\n")
    assert not converge.trained(1, log) and not converge.trained(None, log)



def test_decoding_time_and_output_tokens_from_fairseq_generates_log():
    from recipes.wmt17.run import decoding_stats

    log = ("2026-11-27 05:00:00 | INFO | fairseq_cli.generate | Translated 1,151 sentences (41,207 tokens) "
           "in 3.2s (359.69 sentences/s, 12877.19 tokens/s)\n")
    assert decoding_stats(log) == (3.2, 41207.0)
