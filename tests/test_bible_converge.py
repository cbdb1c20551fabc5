"""recipes/bible/converge.py end to end on CPU at toy size: the GPU run's driver (smoke, the four
models side by side, decoding best and averaged checkpoints, the archive) and the report that scores
it here. After this passes, the GPU run can only fail because of the GPU."""

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile

import pytest
from conftest import clean_env
from test_bible_cli import prepared_data

from recipes.bible import converge, converge_settings, converged_table
from recipes.train_log import read_train_log

SCRIPT = ["-m", "recipes.bible.converge"]
# The recipe's models at toy width and depth (options both fairseq-train architectures take).
TOY_SIZES = "--encoder-embed-dim 32 --decoder-embed-dim 32 --encoder-layers 1 --decoder-layers 1"


def driver(*args, timeout=600):
    return subprocess.run([sys.executable, *SCRIPT, *args], env=clean_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=timeout)


# The four models of the two pairs and one LSTM variant, in one run that both tests below read.
DRIVER_MODELS = [*converge.PAIR_MODELS, "lstm_memattn_no_position"]


@pytest.fixture(scope="module")
def driver_run(own_pair_recipe, tmp_path_factory):
    """The GPU run's driver on CPU at toy size, then its report: (data, bundle, archive, names in it, results)."""
    tmp = tmp_path_factory.mktemp("driver")
    data, bundle, out = own_pair_recipe["out"], tmp / "bundle", tmp / "out"
    assert driver("pack", "--data", str(data), "--bundle", str(bundle), "--no-wheels").returncode == 0
    # Batches of about 100 of the toy data's 2,000 sentences: 60 updates are 2-3 epochs, more than one
    # epoch checkpoint to average.
    ran = driver("run", "--bundle", str(bundle), "--out", str(out), "--work", str(tmp / "work"), "--cpu",
                 "--models", *DRIVER_MODELS, "--smoke-updates", "1", "--max-update", "60", "--minutes", "15",
                 "--decode-minutes", "2", "--train-args", "--max-tokens 1000 --batch-size 100 " + TOY_SIZES,
                 "--generate-args", "--max-len-b 5", timeout=1200)  # beyond --minutes 15
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    with tarfile.open(out / converge.ARCHIVE) as tar:
        names = set(tar.getnames())
    results = tmp / "results"
    reported = driver("report", str(out / converge.ARCHIVE), "--data", str(data), "--out", str(results))
    assert reported.returncode == 0, reported.stderr[-3000:]
    return dict(data=data, bundle=bundle, archive=out / converge.ARCHIVE, names=names, results=results)


@pytest.mark.slow
def test_run_then_report(driver_run):
    names, results = driver_run["names"], driver_run["results"]
    assert {name.split("/")[1] for name in names if name.count("/") > 1} == {*DRIVER_MODELS, "convert"}  # --models only
    for model in converge.PAIR_MODELS:
        for name in ("command.txt", "train.log", "smoke.log", "best/hyp.test.fr", "best/hyp.valid.fr",
                     "average/hyp.test.fr", "average/hyp.valid.fr", "average/averaged.txt"):
            assert f"converged/{model}/{name}" in names
    assert not any(name.endswith(".pt") for name in names)  # checkpoints stay on the machine
    assert "converged/command.txt" in names  # the driver's own command line, for the report
    # The transformer converted and fine-tuned beside itself continued, each decoded on test.
    assert {"converged/convert/source.json", "converged/convert/converted_0/hyp.test.fr"} <= names
    for run in converge_settings.CONVERT_RUNS:
        assert sum(re.fullmatch(rf"converged/convert/{run}_[1-9]\d*/hyp\.test\.fr", n) is not None for n in names) == 2

    table = (results / "table.md").read_text()
    for model in converge.PAIR_MODELS:
        row = next(line for line in table.splitlines() if line.startswith(f"| {model} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        # The toy run had no GPU: its machine.txt names none.
        assert cells[1:4] == ["CPU", "--max-update", "60"] and int(cells[4]) >= 2
        assert all(float(cell) >= 0 for cell in cells[6:10])  # BLEU and chrF of best and averaged
        assert cells[10] in ("best", "average") and float(cells[12]) > 0  # ms per output token
        assert (results / model / "best" / "generate.test.txt.gz").exists()
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in table and "nc:6|nw:0" in table  # BLEU and chrF signatures
    assert table.startswith("# Bible en-fr at convergence: memory attention against its baseline, on one CPU")
    assert_length_rows(table, converge.PAIR_MODELS)
    bundle, out = driver_run["bundle"], driver_run["archive"].parent
    assert f"python -m recipes.bible.converge run --bundle {bundle} --out {out}" in table
    for baseline in converge_settings.PAIRS:
        assert (results / f"curves_{baseline}.png").stat().st_size > 0
    conversion = table[table.index("## The converged transformer converted"):]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in conversion.splitlines()
            if re.match(r"\| (transformer|converted|original)", line)]
    source = int(rows[0][1])
    assert [row[0] for row in rows] == ["transformer (the source)", "converted, before fine-tuning",
                                        "converted", "original", "converted", "original"]
    assert [int(row[2]) for row in rows] == [0, 0, *[total - source for total in
                                                      sorted(int(row[1]) for row in rows[2:])]]
    assert all(float(row[3]) >= 0 and float(row[4]) > 0 for row in rows)
    assert all(float(row[5]) > 0 for row in rows[2:])  # fairseq-train's validation at the fine-tuned update


@pytest.mark.slow
def test_broken_environment_fails_in_the_smoke_step(own_pair_recipe, tmp_path):
    bundle = tmp_path / "bundle"
    converge.main(["pack", "--data", str(own_pair_recipe["out"]), "--bundle", str(bundle), "--no-wheels"])
    ran = driver("run", "--bundle", str(bundle), "--out", str(tmp_path / "out"), "--work", str(tmp_path / "w"),
                 "--cpu", "--train-args", "--optimizer no_such_optimizer", timeout=300)
    assert ran.returncode == 1
    assert "smoke training failed" in ran.stdout and "side by side" not in ran.stdout
    assert (tmp_path / "out" / converge.ARCHIVE).exists()  # the logs come back even so


def test_run_refuses_a_work_folder_an_earlier_run_left(tmp_path):
    (tmp_path / "w" / "checkpoints" / "transformer").mkdir(parents=True)  # fairseq-train would resume these
    ran = driver("run", "--bundle", prepared_data(tmp_path / "bundle"), "--out", str(tmp_path / "out"), "--work",
                 str(tmp_path / "w"), "--cpu", timeout=120)
    assert ran.returncode == 2 and ran.stderr.splitlines()[-1].endswith(
        f"argument --work: {tmp_path / 'w'}: not empty (fairseq-train would resume an earlier run's checkpoints)")
    assert not (tmp_path / "out").exists()


def test_a_decoding_still_running_at_the_deadline_is_killed(tmp_path, monkeypatch):
    from argparse import Namespace

    from recipes.wmt17 import run as wmt17_run

    (tmp_path / "data-bin").mkdir()
    (tmp_path / "data-bin" / "dict.fr.txt").write_text("a 1\n")
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "valid.fr").write_text("a\n")
    (tmp_path / "checkpoint.pt").write_text("")
    hanging = tmp_path / "fairseq-generate"
    hanging.write_text("#!/bin/sh\nexec sleep 60\n")
    hanging.chmod(0o755)
    monkeypatch.setattr(wmt17_run, "fairseq_tool", lambda name: str(hanging))
    args = Namespace(bundle=str(tmp_path), cpu=True, generate_args="", deadline=converge.time.monotonic() + 6)
    started = converge.time.monotonic()
    assert converge.evaluate(args, str(tmp_path / "checkpoint.pt"), "valid", str(tmp_path / "out")) is None
    assert converge.time.monotonic() - started < 15
    args.deadline = converge.time.monotonic() + 1  # too little time left: not started at all
    assert converge.evaluate(args, str(tmp_path / "checkpoint.pt"), "valid", str(tmp_path / "out")) is None


def scored(valid_best, valid_average):
    return {"checkpoints": {"best": {"valid": {"bleu": valid_best}},
                            "average": {"valid": {"bleu": valid_average}}}}


def test_averaged_checkpoint_only_where_it_helps_both_models_of_a_pair():
    both = {"transformer": scored(10, 11), "transformer_memattn": scored(9, 9.5)}
    one = {"transformer": scored(10, 11), "transformer_memattn": scored(9, 8.5)}
    assert converged_table.chosen_checkpoint(both, "transformer", "transformer_memattn") == "average"
    assert converged_table.chosen_checkpoint(one, "transformer", "transformer_memattn") == "best"


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


def test_epochs_since_the_best_validation():
    from recipes.bible.converge_cpu import epochs_since_best

    assert epochs_since_best([]) == 0
    assert epochs_since_best([(10, 5.0), (20, 4.0), (30, 4.5), (40, 4.2)]) == 2
    assert epochs_since_best([(10, 5.0), (20, 4.0), (30, 4.0)]) == 1  # a tie is no improvement
    assert epochs_since_best([(10, 5.0), (20, 4.0)]) == 0


def cpu_driver(data, tmp_path, *args, timeout=900):
    return subprocess.run([sys.executable, "-m", "recipes.bible.converge_cpu", "--data", str(data), "--work",
                           str(tmp_path / "work"), "--out", str(tmp_path / "results"), *args],
                          env=clean_env(), capture_output=True, text=True, timeout=timeout)


def test_cpu_training_stops_after_patience_epochs_however_often_it_is_resumed(tmp_path, monkeypatch):
    """converge_cpu.train against a stand-in fairseq-train that logs one validation an epoch from a
    fixed sequence of losses: each call must ask for exactly the epochs that could pass before a stop,
    and the run ends when the best is --patience epochs old, also when resumed in the middle."""
    from argparse import Namespace

    from recipes.bible import converge_cpu

    losses = [5.0, 4.0, 4.2, 3.9, 4.0, 4.1, 3.95, 4.3, 3.0]  # best at epoch 4, then 3 without a better one
    asked = []

    def fake_fairseq(command, log, lock):
        last = int(command[command.index("--max-epoch") + 1])
        asked.append(last)
        done = len(read_train_log(log)["curve"]) if os.path.exists(log) else 0
        with open(log, "a") as f:
            for epoch in range(done + 1, last + 1):
                f.write(f"2026-01-01 00:00:00 | INFO | valid | epoch {epoch:03d} | valid on 'valid' subset | "
                        f"loss {losses[epoch - 1]} | nll_loss 1 | num_updates {10 * epoch}\n")
        return True

    monkeypatch.setattr(converge_cpu, "run_fairseq", fake_fairseq)
    args = Namespace(out=str(tmp_path), work=str(tmp_path), data=str(tmp_path), seed=1, patience=3,
                     max_epoch=100, train_args=[], pair="transformer")
    assert converge_cpu.train(args, "transformer", None, lambda: None)
    # 3 epochs (best at 2, 1 old), 2 more (best at 4, 1 old), 2 more: best 3 old, stop.
    assert asked == [3, 5, 7]
    log = converge_cpu.log_path(args, "transformer")
    assert len(read_train_log(log)["curve"]) == 7
    asked.clear()
    assert converge_cpu.train(args, "transformer", None, lambda: None) and asked == []  # resumed: done
    args.max_epoch, args.patience = 8, 5
    assert converge_cpu.train(args, "transformer", None, lambda: None) and asked == [8]  # the cap


def test_a_round_that_validates_no_epoch_stops_the_model(tmp_path, monkeypatch):
    """A checkpoint in --work ahead of the log (fairseq-train resumes past --max-epoch and trains
    nothing): the model stops with a message instead of asking for the same epochs forever."""
    from argparse import Namespace

    from recipes.bible import converge_cpu

    asked, said = [], []
    monkeypatch.setattr(converge_cpu, "run_fairseq", lambda command, log, lock: asked.append(command) or True)
    monkeypatch.setattr(converge, "log", said.append)
    args = Namespace(out=str(tmp_path), work=str(tmp_path), data=str(tmp_path), seed=1, patience=3,
                     max_epoch=100, train_args=[], pair="transformer")
    assert converge_cpu.train(args, "transformer", None, lambda: None) is False
    assert len(asked) == 1 and "validated no new epoch" in said[-1]


def test_outputs_of_an_earlier_best_checkpoint_are_decoded_again(tmp_path, monkeypatch):
    """Training resumed (a larger --patience) moved checkpoint_best.pt: its old outputs are removed
    and the model decoded again; the table's best update is the decoded checkpoint's."""
    from argparse import Namespace

    from recipes.bible import converge_cpu

    args = Namespace(out=str(tmp_path / "out"), work=str(tmp_path / "work"), data=str(tmp_path))
    folder = tmp_path / "out" / "cpu" / "lstm_att"
    for part in ("best/hyp.valid.fr", "average/hyp.test.fr", "average/hyp.valid.fr"):
        (folder / part).parent.mkdir(parents=True, exist_ok=True)
        (folder / part).write_text("old\n")
    os.makedirs(converge_cpu.checkpoint_dir(args, "lstm_att"))
    open(converge_cpu.best_checkpoint(args, "lstm_att"), "w").close()
    saved = {"updates": 100}
    monkeypatch.setattr(converge_cpu.convert_run, "saved_updates", lambda path: saved["updates"])
    assert converge_cpu.decoded(args, "lstm_att")  # decoded before the update was kept: taken as current
    (folder / "best" / converged_table.BEST_RECORD).write_text(json.dumps({"updates": 100}))
    assert converge_cpu.decoded(args, "lstm_att")
    saved["updates"] = 140
    assert not converge_cpu.decoded(args, "lstm_att")
    decoded = []
    monkeypatch.setattr(converge, "decode", lambda settings, stage, work, model: decoded.append(
        sorted(p.name for p in (folder).rglob("*") if p.is_file())))
    monkeypatch.setattr(converge, "diagnose", lambda *args: None)
    converge_cpu.decode(args, "lstm_att")
    assert decoded == [[]]  # the earlier best checkpoint's outputs gone before decoding
    (folder / "best").mkdir()
    (folder / "best" / converged_table.BEST_RECORD).write_text(json.dumps({"updates": 140}))
    (folder / "train.log").write_text("".join(
        f"2026-01-01 00:00:00 | INFO | valid | epoch {e:03d} | valid on 'valid' subset | loss {loss} | nll_loss 1 "
        f"| num_updates {20 * e}\n" for e, loss in ((6, 3.2), (7, 3.2), (8, 3.3))))
    assert converged_table.read_run(str(folder), {})["log"]["best_update"] == 140  # the log's first tie: 120


def test_a_model_that_stops_first_is_decoded_while_the_others_train(tmp_path, monkeypatch):
    """The driver's threads against stand-ins for fairseq-train and the decoders: lstm_att stops after
    3 epochs, the others train until lstm_att has been decoded (or 10 s); the test split from the best
    checkpoints is decoded after every model has stopped, one at a time."""
    import threading

    from recipes.bible import converge_cpu

    prepared_data(tmp_path / "data")
    first = "lstm_att"
    decoded_first = threading.Event()
    events = []

    def fake_fairseq(command, log, lock):
        model = os.path.basename(os.path.dirname(log))
        if model != first:
            decoded_first.wait(10)
        losses = [5.0, 4.0, 4.5] if model == first else [5.0, 4.0, 3.5, 3.0, 3.1]
        with open(log, "a") as f:
            for epoch, loss in enumerate(losses, 1):
                f.write(f"2026-01-01 00:00:00 | INFO | valid | epoch {epoch:03d} | valid on 'valid' subset | "
                        f"loss {loss} | nll_loss 1 | num_updates {10 * epoch}\n")
        events.append(("trained", model))
        return True

    def fake_decode(args, model):
        events.append(("decoded", model))
        if model == first:
            decoded_first.set()

    monkeypatch.setattr(converge_cpu, "run_fairseq", fake_fairseq)
    monkeypatch.setattr(converge_cpu, "decode", fake_decode)
    monkeypatch.setattr(converge_cpu, "decode_test_alone", lambda args, model: events.append(("test", model)))
    monkeypatch.setattr(converge_cpu, "write_results", lambda *args: None)
    assert converge_cpu.main(["--pair", "lstm", "--patience", "1", "--data", str(tmp_path / "data"),
                              "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]) == 0
    models = converge_cpu.PAIRS["lstm"]
    assert events[:2] == [("trained", first), ("decoded", first)]
    for model in models:
        assert events.index(("decoded", model)) > events.index(("trained", model))
    assert events[-len(models):] == [("test", model) for model in models]


def test_jobs_trains_at_most_that_many_models_at_once_furthest_along_first(tmp_path, monkeypatch):
    """--pair lstm --jobs 2, the trio on two cores: the two models furthest along train first (here the
    variant, resumed after one epoch, then lstm_att), the third once one of them has stopped."""
    import threading

    from recipes.bible import converge_cpu

    prepared_data(tmp_path / "data")
    paths = argparse.Namespace(out=str(tmp_path / "out"), work=str(tmp_path / "work"))
    resumed = "lstm_memattn_position_mean"
    os.makedirs(converge_cpu.checkpoint_dir(paths, resumed))
    open(os.path.join(converge_cpu.checkpoint_dir(paths, resumed), "checkpoint_last.pt"), "w").close()
    os.makedirs(os.path.dirname(converge_cpu.log_path(paths, resumed)))
    started, running, most, guard, second = [], set(), [0], threading.Lock(), threading.Event()

    def valid_line(epoch, loss):
        return (f"2026-01-01 00:00:00 | INFO | valid | epoch {epoch:03d} | valid on 'valid' subset | loss {loss} "
                f"| nll_loss 1 | num_updates {10 * epoch}\n")

    with open(converge_cpu.log_path(paths, resumed), "w") as f:
        f.write(valid_line(1, 6.0))

    def fake_fairseq(command, log, lock):
        model = os.path.basename(os.path.dirname(log))
        with guard:
            started.append(model)
            running.add(model)
            most[0] = max(most[0], len(running))
            if len(started) == 2:
                second.set()
        second.wait(10)  # the first two overlap, as far as --jobs lets them
        done = len(read_train_log(log)["curve"]) if os.path.isfile(log) else 0
        with open(log, "a") as f:  # a better epoch, then a worse one: --patience 1 stops it
            f.write(valid_line(done + 1, 4.0) + valid_line(done + 2, 4.5))
        with guard:
            running.discard(model)
        return True

    monkeypatch.setattr(converge_cpu, "run_fairseq", fake_fairseq)
    monkeypatch.setattr(converge_cpu, "decode", lambda args, model: None)
    monkeypatch.setattr(converge_cpu, "decode_test_alone", lambda args, model: None)
    monkeypatch.setattr(converge_cpu, "write_results", lambda *args: None)
    assert converge_cpu.main(["--pair", "lstm", "--patience", "1", "--jobs", "2", "--data", str(tmp_path / "data"),
                              "--work", paths.work, "--out", paths.out]) == 0
    # PAIRS' order would have been lstm_att, lstm_memattn (threads may reach fairseq-train in either order)
    assert set(started[:2]) == {resumed, "lstm_att"} and started[2] == "lstm_memattn" and most[0] == 2


def assert_length_rows(table, models):
    """Each model's test BLEU by source length, once, from the checkpoint its pair is compared on."""
    section = table.split("## Test BLEU by source length")[1].split("\n## ")[0]
    for model in models:
        rows = re.findall(rf"^\| {model} \((?:best|average)\) \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \|", section, re.M)
        assert len(rows) == 1, (model, section)


@pytest.mark.slow
def test_cpu_run_decodes_converts_and_resumes_with_nothing_to_do(own_pair_recipe, tmp_path):
    from recipes.bible import converge_cpu

    data = own_pair_recipe["out"]
    toy = ["--max-epoch", "3", "--convert-fractions", "0.2",
           "--train-args", "--max-tokens 1000 --batch-size 100 --warmup-updates 10 " + TOY_SIZES]
    ran = cpu_driver(data, tmp_path, *toy)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    table = (tmp_path / "results" / "table.md").read_text()
    pair = converge_cpu.PAIRS["transformer"]
    for model in pair:
        row = next(line for line in table.splitlines() if line.startswith(f"| {model} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1:3] == ["CPU", "--max-epoch"] and cells[4] == "3"
        assert all(float(cell) >= 0 for cell in cells[6:10]) and float(cells[12]) > 0
    rows = [line.split("|")[1].strip() for line in table.split("## The converged transformer converted")[1].splitlines()
            if line.startswith("| ") and not line.startswith(("| model", "| ---"))]
    # one fraction: the converted model fine-tuned, all parameters and the write alone, beside the original
    assert rows[:2] == ["transformer (the source)", "converted, before fine-tuning"]
    assert rows[2] == "converted" and re.fullmatch(r"converted_write[1-9]\d*", rows[3]) and rows[4:] == ["original"]
    assert "fine-tuned for 20 % of N: all parameters (`converted`), or the write alone" in table
    assert_length_rows(table, pair)
    assert (tmp_path / "results" / "curves_transformer_cpu.png").stat().st_size > 0
    logs = {m: (tmp_path / "results" / "cpu" / m / "train.log").read_text() for m in pair}

    (tmp_path / "results" / "table.md").unlink()
    assert cpu_driver(data, tmp_path, "--report", "--convert-fractions", "0.2", timeout=300).returncode == 0
    reported = (tmp_path / "results" / "table.md").read_text()
    # Without the cap among its options, the report counts the runs as unfinished; the conversion's
    # rows, all evaluated, are kept.
    assert re.search(r"^\| transformer_memattn \| CPU \| still running \| \d+ \| 3 \|", reported, re.M)
    assert reported.split("## The converged transformer converted")[1] == table.split("## The converged transformer converted")[1]
    again = cpu_driver(data, tmp_path, *toy, timeout=300)  # all done: nothing trains again
    assert again.returncode == 0, again.stderr[-3000:]
    assert {m: (tmp_path / "results" / "cpu" / m / "train.log").read_text() for m in pair} == logs


@pytest.mark.slow
def test_cpu_lstm_run_decodes_and_diagnoses_the_three_lstms_and_converts_nothing(own_pair_recipe, tmp_path):
    from recipes.bible import converge_cpu

    # One epoch each: no checkpoints to average (the Transformer's run above averages them).
    ran = cpu_driver(own_pair_recipe["out"], tmp_path, "--pair", "lstm", "--max-epoch", "1", "--train-args",
                     "--batch-size 100 --encoder-hidden-size 32 --decoder-hidden-size 32 " + TOY_SIZES)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    results = tmp_path / "results"
    for model in converge_cpu.PAIRS["lstm"]:
        log = (results / "cpu" / model / "train.log").read_text()
        assert "--arch lstm_memattn_wmt" in log and "--encoder-hidden-size 128" in log  # the LSTM's CPU size
        assert "--encoder-ffn-embed-dim" not in log  # not the Transformer's
    table = (results / "table.md").read_text()
    assert table.startswith("# Bible en-fr at convergence: lstm_memattn, lstm_memattn_position_mean against lstm_att")
    assert "python -m recipes.bible.converge_cpu --pair lstm --data DATA" in table
    for model in ("lstm_att", "lstm_memattn"):  # the pair, on test
        cells = [c.strip() for c in next(line for line in table.splitlines()
                                         if line.startswith(f"| {model} |")).strip("|").split("|")]
        assert cells[1:3] == ["CPU", "--max-epoch"] and cells[4] == "1"
        assert all(float(cell) >= 0 for cell in cells[6:8]) and cells[8:10] == ["", ""] and float(cells[12]) > 0
    # The variant put forward as the fix (converge.FIXES) on test too, beside the pair; the memory LSTMs'
    # reads measured.
    assert (results / "cpu" / "lstm_memattn_position_mean" / "best" / "hyp.test.fr").exists()
    section = table.split("## The LSTM gap, on validation")[1]
    variant = [line for line in section.splitlines() if line.startswith("| lstm_memattn_position_mean |")]
    assert len(variant) == 2 and variant[1].split("|")[2].strip() == "--memory-position-normalize mean"
    assert all(0 <= float(cell) <= 1 for cell in variant[1].strip("|").split("|")[5:9])
    assert (results / "cpu" / "lstm_memattn" / f"attention_valid{converge_settings.PLOTTED_EXAMPLE}.png").exists()
    assert "converted" not in table and not (tmp_path / "work" / "convert").exists()
    assert (results / "curves_lstm_cpu.png").stat().st_size > 0


def test_cpu_driver_refuses_a_fraction_that_is_not_positive(tmp_path, capsys):
    from recipes.bible import converge_cpu

    with pytest.raises(SystemExit) as stopped:
        converge_cpu.main(["--data", prepared_data(tmp_path), "--convert-fractions", "0.1", "0"])
    assert stopped.value.code == 2
    assert "argument --convert-fractions: invalid value 0 (must be a finite number > 0)" in capsys.readouterr().err


def test_cpu_report_refuses_a_folder_without_the_runs_logs(tmp_path, capsys):
    from recipes.bible import converge_cpu

    with pytest.raises(SystemExit) as stopped:
        converge_cpu.main(["--data", prepared_data(tmp_path / "data"), "--pair", "lstm", "--out",
                           str(tmp_path / "nothing"), "--report"])
    assert stopped.value.code == 2
    assert f"--out {tmp_path / 'nothing'}: no run's log under {tmp_path / 'nothing' / 'cpu'}" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()


def test_a_second_cpu_driver_exits_while_the_first_holds_the_lock(tmp_path):
    from recipes.bible import converge_cpu

    prepared_data(tmp_path / "data")
    assert converge_cpu.hold_lock(str(tmp_path / "work")) is not None
    ran = cpu_driver(tmp_path / "data", tmp_path, timeout=120)
    assert ran.returncode == 0 and "already running" in ran.stdout
    assert not (tmp_path / "results" / "cpu").exists()  # nothing started


def test_cpu_driver_refuses_logs_whose_checkpoints_are_gone(tmp_path):
    """Logs from another machine (their checkpoints not in --work): resuming would train from scratch
    while counting patience from the old curve, so the driver stops with one line and starts nothing."""
    from recipes.bible import converge_cpu

    prepared_data(tmp_path / "data")
    log = tmp_path / "results" / "cpu" / "transformer_memattn" / "train.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"2026-01-01 00:00:00 | INFO | valid | epoch {e:03d} | valid on 'valid' subset | "
                           f"loss {5 - e / 10} | nll_loss 1 | num_updates {10 * e}\n" for e in (1, 2)))
    ran = cpu_driver(tmp_path / "data", tmp_path, timeout=120)
    error = ran.stderr.splitlines()[-1]  # after argparse's usage
    assert ran.returncode == 2 and error.startswith("converge_cpu.py: error: --out ")
    assert (f"{log} has 2 epochs, but --work {tmp_path / 'work'} has no checkpoints/transformer_memattn/"
            "checkpoint_last.pt") in error
    assert not (tmp_path / "results" / "cpu" / "transformer").exists()  # nothing started
    checkpoints = tmp_path / "work" / "checkpoints" / "transformer_memattn"
    checkpoints.mkdir(parents=True)
    (checkpoints / "checkpoint_last.pt").touch()
    args = argparse.Namespace(out=str(tmp_path / "results"), work=str(tmp_path / "work"), patience=5,
                              max_epoch=100)
    assert converge_cpu.orphaned_log(args, "transformer_memattn") is None
    (checkpoints / "checkpoint_last.pt").unlink()
    args.max_epoch = 2  # a finished run needs no checkpoint to go on from
    assert converge_cpu.orphaned_log(args, "transformer_memattn") is None


@pytest.mark.slow
def test_lstm_variants_are_trained_decoded_on_validation_and_diagnosed(driver_run):
    names, results = driver_run["names"], driver_run["results"]
    assert "converged/lstm_memattn_no_position/best/hyp.valid.fr" in names
    assert not any(n.startswith("converged/lstm_memattn_no_position/") and "test" in n for n in names)  # valid only
    for model in ("lstm_att", "lstm_memattn", "lstm_memattn_no_position"):
        assert f"converged/{model}/attention_valid{converge_settings.PLOTTED_EXAMPLE}.png" in names
    section = (results / "table.md").read_text().split("## The LSTM gap, on validation")[1]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| lstm")}
    # Two tables, one row per model each: the outputs' (repetition, BLEU by length) and the memory's.
    assert sum(line.startswith("| lstm_memattn_no_position |") for line in section.splitlines()) == 2
    memory = rows["lstm_memattn_no_position"]
    assert memory[1] == "--no-memory-position-encoding"
    assert all(0 <= float(cell) <= 1 for cell in memory[5:9])
    assert rows["lstm_att"][5:9] == ["", "", "", ""]  # no memory to read


def test_memory_statistics_of_known_weights():
    import torch

    from recipes.bible.lstm_gap import memory_statistics

    one_hot = torch.eye(4)  # S = K = 4: context k holds token k alone; step t reads context t
    sharp = memory_statistics(one_hot, one_hot)
    assert sharp == pytest.approx({"beta_entropy": 0, "beta_max": 1, "alpha_entropy": 0, "alpha_similarity": 0})
    flat = memory_statistics(torch.full((5, 4), 0.5), torch.full((3, 4), 0.25))
    assert flat == pytest.approx({"beta_entropy": 1, "beta_max": 0.25, "alpha_entropy": 1, "alpha_similarity": 1})
    # Two of four contexts equal and two steps: by hand, beta (0.5, 0.5, 0, 0) has entropy log 2 / log 4.
    alpha = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    half = memory_statistics(alpha, torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]]))
    assert half["beta_entropy"] == pytest.approx((0.5 + 0.0) / 2)
    assert half["beta_max"] == pytest.approx((0.5 + 1.0) / 2)
    assert half["alpha_similarity"] == pytest.approx(2 / 12)  # one equal pair of 6, counted both ways


def test_repetition_and_bleu_by_length_of_outputs():
    from recipes.bible import lstm_gap

    assert lstm_gap.repeated_trigrams("a b c a b c a") == (2, 5)  # "a b c" and "b c a" come back
    assert lstm_gap.repeated_trigrams("a b") == (0, 0)
    assert lstm_gap.repetition(["a b c a b c", "x y z"]) == (pytest.approx(100 / 5), 50.0)
    references = ["the cat sat on the mat today", "a dog ran in the park this morning"]
    bands = lstm_gap.bleu_by_band(["the cat sat on the mat today", "nothing like it"], references, [5, 30])
    assert bands[(1, 20)] == (1, pytest.approx(100.0)) and bands[(21, 40)][1] < 10 and len(bands) == 2
    table = lstm_gap.table({"model": ["the cat sat on the mat today", "nothing like it"]}, references, [5, 30])
    cells = [re.split(r"(?<!\\)\|", line.strip("|")) for line in table.splitlines()]  # markdown's cells
    assert {len(row) for row in cells} == {6} and cells[0][4].strip() == "BLEU, \\|S\\| 1-20 (1)"


def test_the_table_has_a_row_for_each_variant_trained_beside_its_pair():
    """The LSTM trio's third model, lstm_memattn_position_mean, was missing from its table: each
    variant gets a row after its pair, compared with the baseline on the checkpoint chosen for the two."""
    def run(test_bleu, valid_best, valid_average):
        test = {"bleu": test_bleu, "chrf": 40.0, "signatures": ["sig"]}
        return {"log": {"stopped": "running", "updates": 100, "epochs": 2, "best_valid_loss": 4.0, "best_update": 100,
                        "curve": [(50, 4.5), (100, 4.0)]},
                "checkpoints": {"best": {"test": test, "valid": {"bleu": valid_best}},
                                "average": {"test": {**test, "bleu": test_bleu + 1}, "valid": {"bleu": valid_average}}}}

    runs = {"lstm_att": run(10.0, 5.0, 6.0), "lstm_memattn": run(8.0, 5.0, 4.0),
            "lstm_memattn_position_mean": run(9.5, 5.0, 6.0)}
    rows, _ = converged_table.pair_rows(runs, "CPU")
    assert [row.split(" | ")[0] for row in rows] == ["| lstm_att", "| lstm_memattn", "| lstm_memattn_position_mean"]
    # lstm_memattn: the average is worse on validation for it, so the best: 8.00 - 10.00;
    # the variant: the average better for both, so the average: 10.50 - 11.00
    assert [row.split(" | ")[-3:-1] for row in rows[1:]] == [["best", "-2.00"], ["average", "-0.50"]]
    # a run before its first validation (or waiting for a core): no loss yet, not the log reader's nan
    runs["lstm_memattn"] = {"log": {"stopped": "no epoch", "updates": 0, "epochs": 0, "best_valid_loss": float("nan"),
                                    "best_update": 0, "curve": []}, "checkpoints": {}}
    assert converged_table.pair_rows(runs, "CPU")[0][1] == "| lstm_memattn | CPU | no epoch yet | 0 | 0 |  |  |  |  |  |  |  |  |"


def test_the_table_names_the_driver_of_each_model_it_shows():
    """A variant trained by a driver of its own beside the trio (its own --work, the same --out): the
    table shows both command lines, whichever driver wrote it last."""
    from recipes.bible import converge_cpu

    trio = "nohup nice -n 10 python -m recipes.bible.converge_cpu --pair lstm --data DATA > converge_cpu.log 2>&1 &"
    assert converge_cpu.driver_commands("lstm", list(converge_cpu.PAIRS["lstm"])) == [trio]
    assert converge_cpu.driver_commands("lstm", [*converge_cpu.PAIRS["lstm"], "lstm_memattn_attention_read"]) == [
        trio, "nohup nice -n 10 python -m recipes.bible.converge_cpu --pair lstm --models lstm_memattn_attention_read "
              "--data DATA --work WORK2 > converge_cpu.log 2>&1 &"]
    assert converge_cpu.driver_commands("lstm", ["lstm_att"]) == [
        "nohup nice -n 10 python -m recipes.bible.converge_cpu --pair lstm --models lstm_att --data DATA "
        "> converge_cpu.log 2>&1 &"]
