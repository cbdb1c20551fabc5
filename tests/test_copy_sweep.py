"""recipes/copy/sweep.py: selection of the scoring on validation (screens, then the chosen one
continued), convergence detection, resume, tables.

One real sweep of the `tiny` preset (K = 1, two of its scoring combinations, seconds per run) is
interrupted during its first screen, resumed, re-decoded and re-run; the rest checks the log parser
and the tables on hand-written logs and results.
"""

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import BIN, REPO, clean_env

from recipes.copy import sweep
from recipes.wmt17.run import fairseq_train_options


def start(at=0):
    """A fairseq-train process's first line, ``at`` seconds into the day."""
    return f"2026-01-01 {clock(at)} | INFO | fairseq_cli.train | {{'_name': None}}\n"


def clock(seconds):
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


START = start()


def valid(updates, loss):
    return (f"2026-01-01 00:00:01 | INFO | valid | epoch 001 | valid on 'valid' subset | loss {loss} "
            f"| ppl 2 | wps 1 | wpb 1 | bsz 1 | num_updates {updates}\n")


def inner(updates, at, wall=None):
    """A train_inner line ``at`` seconds into the day; fairseq's own ``wall`` meter says ``wall``
    (by default the same)."""
    return (f"2026-01-01 {clock(at)} | INFO | train_inner | epoch 001:  1 / 9 loss=1, ppl=2, wps=1, ups=1, "
            f"num_updates={updates}, lr=0.001, gnorm=1, clip=0, train_wall=1, "
            f"wall={at if wall is None else wall}\n")


EARLY_STOP = "x | INFO | fairseq_cli.train | early stop since valid performance hasn't improved for last 2 runs\n"
CAP = "x | INFO | fairseq_cli.train | Stopping training due to num_updates: 40 >= max_update: 40\n"
DONE = "x | INFO | fairseq_cli.train | done training in 9.0 seconds\n"


def parse(tmp_path, text):
    path = tmp_path / "train.log"
    path.write_text(text)
    return sweep.read_train_log(str(path))


def test_log_parser_converged_cap_unfinished_and_resumed(tmp_path):
    converged = parse(tmp_path, START + valid(10, 3.0) + inner(10, 5) + valid(20, 2.5) + valid(30, 2.6)
                      + inner(40, 11) + valid(40, 2.7) + EARLY_STOP + DONE)
    assert (converged["stopped"], converged["updates"], converged["best_update"]) == ("converged", 40, 20)
    assert converged["best_valid_loss"] == 2.5 and converged["train_seconds"] == 11
    cap = parse(tmp_path, START + valid(20, 3.0) + CAP + valid(40, 2.0) + DONE)
    assert (cap["stopped"], cap["updates"], cap["best_update"]) == ("cap", 40, 40)
    assert parse(tmp_path, START + valid(20, 3.0))["stopped"] is None  # interrupted: resume it
    # Interrupted after update 30 (checkpoint at 20), resumed: the repeated update count keeps the
    # later value, the curve has no gap, and only the last process's stop counts.
    resumed = parse(tmp_path, START + valid(10, 3.0) + valid(20, 2.0) + valid(30, 2.2)
                    + START + valid(30, 1.9) + valid(40, 1.5) + CAP + DONE)
    assert resumed["curve"] == [(10, 3.0), (20, 2.0), (30, 1.9), (40, 1.5)]
    assert resumed["stopped"] == "cap"
    # A resumed fairseq-train reports wall=0: the seconds are each process's span of timestamps.
    resumed = parse(tmp_path, START + inner(10, 100) + valid(10, 3.0) + start(7200)
                    + inner(20, 7230, wall=0) + CAP + DONE)
    assert resumed["train_seconds"] == 100 + 30


def test_epoch_seconds_count_from_each_process_start(tmp_path):
    def end_of_epoch(epoch, at):
        return f"2026-01-01 {clock(at)} | INFO | fairseq_cli.train | end of epoch {epoch} (average epoch stats below)\n"

    # Epoch 2 held an hour's pause; the resumed process counts its first epoch from its own start.
    parsed = parse(tmp_path, START + end_of_epoch(1, 400) + end_of_epoch(2, 400 + 3600 + 420)
                   + start(7200) + end_of_epoch(3, 7200 + 410) + DONE)
    assert parsed["epoch_seconds"] == [400, 4020, 410] and parsed["epochs"] == 3


def fake_result(bleu, loss, stopped="converged", updates=1000, outputs=(["1 2", "5 6 7 8 9"],) * 2):
    return dict(bleu=bleu, accuracy=bleu / 2, best_valid_loss=loss, stopped=stopped, updates=updates,
                best_update=updates - 500, train_seconds=60.0, decode_seconds=1.0,
                curve=[(500, loss + 1), (updates, loss)], outputs=outputs)


def fake_screen(loss, stopped="cap", updates=3000):
    return dict(screen_loss=loss, stopped=stopped, updates=updates, curve=[(500, loss + 1), (updates, loss)])


def test_read_screen_judges_every_combination_on_the_same_updates(tmp_path):
    """A screen that has since trained on (the chosen one, or a run of an earlier sweep) is judged
    on its validations within the budget, like the ones that stopped there."""
    (tmp_path / "train.log").write_text(START + valid(10, 3.0) + valid(20, 2.5) + CAP + DONE
                                        + START + valid(30, 1.0) + CAP + DONE)
    screen = sweep.read_screen(str(tmp_path), budget=20)
    assert screen["screen_loss"] == 2.5 and screen["curve"] == [(10, 3.0), (20, 2.5)]


def test_a_screen_has_ended_once_it_validated_at_the_budget(tmp_path):
    """A screen ends when its training stops, or once it has validated at the budget: a sweep
    interrupted while the chosen combination's continuation trains on (the log appended, not
    finished) must not run the screen again."""
    log = tmp_path / "train.log"
    assert not sweep.screen_ended(str(tmp_path), 40)
    log.write_text(START + valid(20, 1.5))  # screening, interrupted
    assert not sweep.screen_ended(str(tmp_path), 40)
    screened = START + valid(20, 1.5) + valid(40, 1.2) + CAP + DONE
    log.write_text(screened)
    assert sweep.screen_ended(str(tmp_path), 40)
    log.write_text(screened + start(60))  # the continuation started, not validated yet
    assert sweep.screen_ended(str(tmp_path), 40)
    log.write_text(screened + start(60) + valid(60, 0.9))  # the continuation trains on
    assert sweep.screen_ended(str(tmp_path), 40)
    log.write_text(START + valid(20, 1.5) + EARLY_STOP + DONE)  # converged before the budget
    assert sweep.screen_ended(str(tmp_path), 40)


def test_selection_seeds_and_tables(tmp_path):
    screens = {
        (20, "K=4", ("sigmoid", "sigmoid")): fake_screen(0.30),
        (20, "K=4", ("sigmoid", "softmax")): fake_screen(0.10),  # best validation loss at the budget
        (20, "K=4", ("softmax", "sigmoid")): fake_screen(0.20, "converged", 2500),
        (20, "K=4", ("softmax", "softmax")): fake_screen(2.00),
    }
    results = {
        (20, "K=4", ("sigmoid", "softmax"), 1): fake_result(99.0, 0.05),
        (20, "K=4", ("softmax", "sigmoid"), 1): fake_result(99.9, 0.01),  # best final run: not chosen
        (20, "K=4", ("sigmoid", "softmax"), 2): fake_result(97.0, 0.12, "cap", 2000,  # 5 tokens: wrong
                                                            outputs=(["1 2", "5 6 7 8"], ["1 2", "5 6 7 8 9"])),
        (20, "K=4", ("sigmoid", "softmax"), 3): fake_result(98.0, 0.11,  # 2 tokens: wrong order
                                                            outputs=(["2 1", "5 6 7 8 9"], ["1 2", "5 6 7 8 9"])),
        (20, "Att", None, 1): fake_result(100.0, 0.01),
    }
    assert sweep.choose_scoring(screens, 20, "K=4") == ("sigmoid", "softmax")
    sweep.write_tables(str(tmp_path), results, screens, [20], ["K=4", "Att"], "cpu", "python sweep.py")
    table = (tmp_path / "table.md").read_text()
    k4 = next(line for line in table.splitlines() if line.startswith("| 20 | K=4 |"))
    # mean 98.00, sample sd 1.00, range 97-99, over the chosen combination's three seeds
    assert "| sigmoid/softmax (of 4) | 3 | 98.00 ± 1.00 (97.00-99.00) |" in k4
    assert "converged at 1000, cap at 2000, converged at 1000" in k4
    assert "| 20 | Att |  | 1 | 100.00 |" in table and "python sweep.py" in table
    assert "| 99.56 |" in k4  # the paper's BLEU
    # the paper's layout: a row per model, BLEU mean ± sd over seeds (mean exact %), the paper beside
    assert table.endswith("| model | L = 20 | paper |\n|---|---|---|\n| K=4 | 98.00 ± 1.00 (49.0) | 99.56 |\n"
                          "| Att | 100.00 (50.0) | 99.98 |\n")
    scoring = (tmp_path / "scoring.md").read_text()
    assert "| 0.300 | **0.100** → 0.050 / 99.00 (converged at 1000) | 0.200 (converged at 2500) | 2.000 |" \
        in scoring and "after 3000 updates" in table
    # L = 20: bands of 4 lengths; the three seeds pooled: of length 2, 2 of 3 right and 1 reordered;
    # of length 5, 2 of 3 right, and 1 short (not reordered)
    by_length = (tmp_path / "by_length.md").read_text()
    assert "| L = 20 | scoring | seeds | 0-3 | 4-7 | 8-11 | 12-15 | 16-19 | 20 |" in by_length
    assert "| K=4 | sigmoid/softmax (of 4) | 3 | 66.7 (+33.3) | 66.7 (+0.0) |  |  |  |  |" in by_length
    rows = list(csv.DictReader(open(tmp_path / "table.csv")))
    assert len(rows) == 7  # four screens (two of them trained on), two more seeds, Att
    assert [r["screen_valid_loss"] for r in rows if r["model"] == "K=4" and r["seed"] == "1"] == \
        ["0.3", "0.1", "0.2", "2.0"]
    chosen = [(r["encoder_score"], r["decoder_score"], r["seed"])
              for r in rows if r["chosen"] == "1" and r["model"] == "K=4"]
    assert chosen == [("sigmoid", "softmax", "1"), ("sigmoid", "softmax", "2"), ("sigmoid", "softmax", "3")]


def test_run_order_puts_longest_length_and_scorings_first():
    Run = sweep.Run
    order = sweep.run_order([20, 50, 100], sweep.MODELS, [1, 2, 3], 16)
    assert len(order) == len(set(order)) == 3 * (5 * (4 + 1) + 3) + 2 * 3 * 8
    # Fig. 3b's four screens, the chosen one trained on, then the baselines
    assert order[:7] == [*(Run(100, "K=16", s, 1, screen=True) for s in sweep.SCORINGS),
                         Run(100, "K=16", "chosen", 1), Run(100, "fairseq lstm", None, 1),
                         Run(100, "No Att", None, 1)]
    # then the other K, largest first: K = 32 and 64 decide whether memory attention matches attention
    assert [r.model for r in order[7:27:5]] == ["K=64", "K=32", "K=4", "K=1"]
    assert set(sweep.MODELS) - {r.model for r in order[:27]} == {"Att"} and all(r.length == 100 for r in order[:27])
    assert all(r.screen == (r.seed == 1 and r.scoring != "chosen" and sweep.is_memory(r.model)) for r in order)
    assert all(r.scoring == "chosen" for r in order if not r.screen and sweep.is_memory(r.model))
    # every length's seed 1 (shortest next), then Att, the slowest to train, longest L first,
    # before any seed 2; the longest length's seeds first
    first_seed2 = order.index(Run(100, "No Att", None, 2))
    assert order[27] == Run(20, "K=16", sweep.SCORINGS[0], 1, screen=True) and order[54].length == 50
    assert order[81:84] == [Run(L, "Att", None, 1) for L in (100, 20, 50)]
    assert all(r.seed == 1 for r in order[:first_seed2]) and first_seed2 == 3 * 28
    assert order.index(Run(100, "K=64", "chosen", 3)) < order.index(Run(20, "K=1", "chosen", 2))


@pytest.mark.slow
def test_bad_arguments_are_named():
    for args, message in [(["--lengths", "0"], "--lengths: [0]"), (["--seeds", "2", "3"], "--seeds: [2, 3]")]:
        result = subprocess.run([sys.executable, "-m", "recipes.copy.sweep", *args],
                                capture_output=True, text=True, env=clean_env(), timeout=120)
        assert result.returncode == 2 and message in result.stderr


CHOICES = ["sigmoid/sigmoid", "softmax/softmax"]  # two of the four, to keep the test short
SELECTED = [tuple(c.split("/")) for c in CHOICES]


def start_sweep(out):
    env = clean_env(OMP_NUM_THREADS="1", PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    return subprocess.Popen([sys.executable, "-m", "recipes.copy.sweep", "--preset", "tiny",
                             "--models", "K=1", "--scorings", *CHOICES, "--seeds", "1", "--out", str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(process):
    out, _ = process.communicate(timeout=600)
    assert process.returncode == 0, out[-3000:]
    return out


def validations(run_dir):
    """(updates, loss) of every validation in a run's train.log, read independently of the driver."""
    text = (run_dir / "train.log").read_text()
    return [(int(u), float(loss)) for loss, u in re.findall(r"\| valid \|.*?\| loss ([\d.]+) .*?num_updates (\d+)", text)]


def interrupt_after_first_checkpoint(process, log):
    """LOG's text once PROCESS's group is killed after the first validation's checkpoint is saved:
    fairseq writes checkpoint_last.pt as a copy after the atomic checkpoint_E_U.pt, and logs
    "Saved checkpoint" when the copy is whole."""
    deadline = time.monotonic() + 600
    while "Saved checkpoint" not in (log.read_text() if log.exists() else ""):
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()[-3000:]
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):  # the whole sweep may be done by now
        os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=60)
    return log.read_text()


@pytest.mark.slow
def test_tiny_sweep_interrupted_resumed_and_selected_on_validation(tmp_path):
    budget = sweep.PRESETS["tiny"]["screen"]
    for attempt in range(3):  # the run's last 16 updates take a third of a second: a poll held up longer misses them
        out = tmp_path / f"try{attempt}"  # a fresh folder: the killed group may still be writing in the last
        runs = {s: out / "runs" / sweep.run_name(6, "K=1", s, 1) for s in SELECTED}
        first = runs[SELECTED[0]]
        interrupted = interrupt_after_first_checkpoint(start_sweep(out), first / "train.log")
        if "done training" not in interrupted:
            break
    assert "done training" not in interrupted and not (first / "score.json").exists()
    tmp_path = out  # the rest reads the try interrupted in time

    finish(start_sweep(tmp_path))
    log = (first / "train.log").read_text()
    assert log.startswith(interrupted)  # appended, not truncated
    assert re.search(r"Loaded checkpoint .*\(epoch \d+ @ [1-9]\d* updates\)", log[len(interrupted):])
    updates = sorted({u for u, _ in validations(first)})
    assert updates == list(range(8, updates[-1] + 1, 8))  # the whole curve, validation every 8

    # Selection on validation at the screening budget: the chosen combination has the lowest
    # validation loss within its first `budget` updates.
    screened = {s: min(loss for u, loss in validations(runs[s]) if u <= budget) for s in SELECTED}
    chosen = min(screened, key=screened.get)
    other = next(s for s in SELECTED if s != chosen)
    scoring_md = (tmp_path / "scoring.md").read_text()
    assert all(f"{loss:.3f}" in scoring_md for loss in screened.values())
    # The other screen stopped at the budget (or converged before it) and was never decoded ...
    assert max(u for u, _ in validations(runs[other])) <= budget and not (runs[other] / "score.json").exists()
    # ... the chosen one trained on from its checkpoint unless it had converged already, and was decoded.
    text = (runs[chosen] / "train.log").read_text()
    if "early stop since" not in text.split("done training")[0]:
        assert re.search(rf"Loaded checkpoint .*\(epoch \d+ @ {budget} updates\)", text)
        assert max(u for u, _ in validations(runs[chosen])) > budget
    score = json.load(open(runs[chosen] / "score.json"))
    table = (tmp_path / "table.md").read_text()
    assert f"| 6 | K=1 | {chosen[0]}/{chosen[1]} (of 2) | 1 | {score['bleu']:.2f} |" in table
    assert (tmp_path / "fig3a.png").stat().st_size > 0 and (tmp_path / "fig3b.png").stat().st_size > 0

    # Finished runs are skipped; a trained but undecoded one is only decoded again.
    log = (runs[chosen] / "train.log").read_text()
    os.remove(runs[chosen] / "score.json")
    out = finish(start_sweep(tmp_path))
    assert out.count("done already, skipped") == 2 and "decoding" in out and ": training" not in out
    assert (runs[chosen] / "train.log").read_text() == log and (runs[chosen] / "score.json").exists()

    # On a new machine (the checkpoints are not committed) an undecoded run trains again from the
    # start, its old log kept aside, instead of failing to decode or appending a second curve.
    for name in ("score.json", "checkpoint_best.pt", "checkpoint_last.pt"):
        os.remove(runs[chosen] / name)
    out = finish(start_sweep(tmp_path))
    assert ": training" in out and (runs[chosen] / "score.json").exists()
    assert (runs[chosen] / "train.lost.log").read_text() == log
    assert (runs[chosen] / "train.log").read_text().count("fairseq_cli.train | {") == 1


def test_run_all_runs_jobs_at_once_and_waits_for_the_scoring_choice():
    """The scheduler with stand-in runs: at most `jobs` at once, in run_order's order as far as they
    can start, a "chosen" run (the screen continued, other seeds) only after all its screens have
    ended, failures not recorded, finished runs not run again."""
    import threading

    Run, scorings = sweep.Run, sweep.SCORINGS[:2]
    runs = sweep.run_order([6], ["K=1", "Att"], [1, 2], 1, scorings)
    earlier = Run(6, "K=1", scorings[0], 1, screen=True)  # screened in an earlier sweep
    trained = Run(6, "Att", None, 1)  # trained in an earlier sweep, late in the order
    slow = Run(6, "K=1", scorings[1], 1, screen=True)  # the last screen to end: the choice waits for it
    failing = Run(6, "Att", None, 2)
    continued, chosen = Run(6, "K=1", scorings[1], 1), Run(6, "K=1", scorings[1], 2)
    lock, events, busy = threading.Lock(), [], []

    def execute(run):
        with lock:
            busy.append(run)
            events.append(("start", run, len(busy)))
        time.sleep(0.3 if run == slow else 0.05)
        with lock:
            busy.remove(run)
            events.append(("end", run, len(busy)))
        return run != failing

    recorded = []

    def record(run):
        recorded.append(run)
        events.append(("record", run, None))

    failed = sweep.run_all(runs, 2, execute, record, scorings, done=lambda run: run in (earlier, trained),
                           choose=lambda length, model: scorings[1])
    assert failed == [failing]
    start = {run: i for i, (kind, run, _) in enumerate(events) if kind == "start"}
    end = {run: i for i, (kind, run, _) in enumerate(events) if kind == "end"}
    assert max(n for kind, _, n in events if kind == "start") == 2  # two at once, never three
    assert earlier not in start and trained not in start
    assert events[:2] == [("record", earlier, None), ("record", trained, None)]  # before any run starts
    assert start[chosen] > end[slow] and start[continued] > end[slow]
    assert start[failing] < start[chosen]  # Att's seed 2 did not wait behind the K=1 choice
    assert set(start) == {slow, continued, failing, chosen}
    assert sorted(recorded) == sorted(set(start) - {failing} | {earlier, trained})


@pytest.mark.slow
def test_tiny_sweep_with_two_jobs(tmp_path):
    """The real driver with --jobs 2: two fairseq-train processes at once, the chosen runs scored,
    and the seed-2 run uses the combination whose screen had the lower validation loss (read from
    the logs).
    Started as the venv's python with no venv on PATH: the driver finds fairseq's commands itself."""
    env = clean_env(OMP_NUM_THREADS="1", PATH="/usr/bin:/bin")
    out = finish(subprocess.Popen(
        [sys.executable, "-m", "recipes.copy.sweep", "--preset", "tiny", "--models", "K=1",
         "--scorings", *CHOICES, "--seeds", "1", "2", "--jobs", "2", "--out", str(tmp_path)], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    runs = tmp_path / "runs"
    budget = sweep.PRESETS["tiny"]["screen"]
    screened = {s: min(loss for u, loss in validations(runs / sweep.run_name(6, "K=1", s, 1)) if u <= budget)
                for s in SELECTED}
    chosen = min(screened, key=screened.get)
    expected = {sweep.run_name(6, "K=1", s, 1) for s in SELECTED} | {sweep.run_name(6, "K=1", chosen, 2)}
    assert {p.name for p in runs.iterdir()} == expected
    scored = {name for name in expected if (runs / name / "score.json").exists()}
    assert scored == {sweep.run_name(6, "K=1", chosen, seed) for seed in (1, 2)}

    def span(name):  # first and last timestamp of a run's first fairseq-train (a screen's, for seed 1)
        text = (runs / name / "train.log").read_text().split("done training")[0]
        stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", text, re.M)  # dated: across midnight too
        return stamps[0], stamps[-1]

    first, second = (span(sweep.run_name(6, "K=1", s, 1)) for s in SELECTED)
    assert first[0] < second[1] and second[0] < first[1]  # the two screens trained at the same time
    assert span(sweep.run_name(6, "K=1", chosen, 2))[0] >= max(first[1], second[1])
    for name in expected:  # every line of the driver's output says whose it is
        assert f"{name}: " in out
    assert f"| 6 | K=1 | {chosen[0]}/{chosen[1]} (of 2) | 2 |" in (tmp_path / "table.md").read_text()



@pytest.mark.slow
def test_fairseq_lstm_row_trains_fairseqs_own_lstm_at_the_presets_sizes(tmp_path):
    """The peer row: fairseq's `lstm` (bidirectional 2-layer encoder, 2-layer decoder) at the
    preset's sizes, trained and scored by the real driver, in the table without a paper figure."""
    env = clean_env(OMP_NUM_THREADS="1", PATH="/usr/bin:/bin")
    finish(subprocess.Popen(
        [sys.executable, "-m", "recipes.copy.sweep", "--preset", "tiny", "--models",
         "fairseq lstm", "--seeds", "1", "--out", str(tmp_path)], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    run = tmp_path / "runs" / sweep.run_name(6, "fairseq lstm", None, 1)
    log = (run / "train.log").read_text()
    sizes = sweep.PRESETS["tiny"]["model"]
    for option in ("arch='lstm'", "encoder_bidirectional=True", "encoder_layers=2", "decoder_layers=2",
                   f"encoder_hidden_size={sizes['units']},", f"decoder_out_embed_dim={sizes['units']},",
                   f"decoder_embed_dim={sizes['embed']},"):  # fairseq logs the model's Namespace
        assert option in log, option
    score = json.load(open(run / "score.json"))
    row = f"| 6 | fairseq lstm |  | 1 | {score['bleu']:.2f} |"
    assert row in (tmp_path / "table.md").read_text()
    assert sweep.paper_bleu(100, "fairseq lstm") == "" and sweep.paper_bleu(100, "Att") == 100.0

    # --tables-only over the whole grid: the finished run's row comes back, nothing else trains,
    # and the table names the sweep's command, not the rewriting call's.
    (tmp_path / "table.md").unlink()
    out = subprocess.run(
        [sys.executable, "-m", "recipes.copy.sweep", "--preset", "tiny", "--seeds", "1",
         "--out", str(tmp_path), "--tables-only"], env=env, capture_output=True, text=True, check=True, timeout=600).stdout
    assert ": training" not in out and [p.name for p in (tmp_path / "runs").iterdir()] == [run.name]
    table = (tmp_path / "table.md").read_text()
    assert row in table and "--tables-only" not in table
    assert f"Made by `python -m recipes.copy.sweep --preset tiny --seeds 1 --out {tmp_path}`" in table
    assert sweep.format_paper_bleu(100.0) == "100.00" and sweep.format_paper_bleu("") == ""


def test_transformer_quality_driver_calls_the_sweeps_runner(tmp_path, monkeypatch):
    """recipes/copy/transformer_quality.py trains through sweep.train_and_score (a real decode of an
    untrained Transformer takes minutes: it runs to the length limit): the call fits that
    function's signature, the budget is the cap, and --memory-args reach the memory models only."""
    import inspect

    from recipes.copy import transformer_quality

    calls = {}

    def fake(*args, **kwargs):
        bound = inspect.signature(sweep.train_and_score).bind(*args, **kwargs)
        calls[os.path.basename(bound.arguments["run_dir"])] = bound.arguments
        return False  # as a failed run: nothing to score

    monkeypatch.setattr(transformer_quality, "train_and_score", fake)
    transformer_quality.main(["--out", str(tmp_path), "--lengths", "4", "--models", "transformer", "K=32 mix",
                              "--updates", "6", "--memory-args=--memory-position-window"])
    assert set(calls) == {"L4_transformer", "L4_K32_mix"}
    for name, call in calls.items():
        assert call["cap"] == 6 and call["copy_args"] == "--copy-max-len 4" and "--max-update" not in call["train_args"]
        assert ("--memory-position-window" in call["train_args"]) == (name == "L4_K32_mix")
    assert "| transformer |  |" in (tmp_path / "table.md").read_text()


def copy_script(name, *args, **env):
    """recipes/copy/NAME with fairseq's commands on PATH (ENV: more variables, or another PATH)."""
    env = {"OMP_NUM_THREADS": "1", "PATH": BIN + os.pathsep + os.environ["PATH"], **env}
    return subprocess.run(["bash", os.path.join(REPO, "recipes", "copy", name), *args], capture_output=True,
                          text=True, timeout=300, env=clean_env(**env))


def refusal(main, capsys, *argv):
    """The error of a driver's MAIN refusing ARGV (exit 2), without the program's name."""
    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    assert stopped.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1].split(": error: ", 1)[1]


def test_train_eval_and_the_quick_start_say_why_they_failed(tmp_path):
    """On standard error, not only in a log: the usage, a missing command, and the failing step's
    own error line."""
    usage = copy_script("train_eval.sh")
    assert usage.returncode == 2 and usage.stderr.startswith("usage: ") and "OUT_DIR" in usage.stderr

    typo = copy_script("quickstart.sh", "--sed", "2", SKIP_SETUP="1", OUT=str(tmp_path / "quickstart"))
    assert typo.returncode == 2
    assert typo.stderr.splitlines() == [
        f"train_eval.sh: error: fairseq-train failed (exit 2); the end of {tmp_path / 'quickstart' / 'train.log'}:",
        "fairseq-train: error: unrecognized arguments: --sed 2"]

    python_only = tmp_path / "bin"
    python_only.mkdir()
    (python_only / "python").symlink_to(sys.executable)
    missing = copy_script("train_eval.sh", str(tmp_path / "run"), PATH=f"{python_only}:/usr/bin:/bin")
    assert missing.returncode == 127
    assert missing.stderr.startswith("train_eval.sh: error: fairseq-train not found on PATH")
    assert not (tmp_path / "run").exists()

    untrained = copy_script("train_eval.sh", str(tmp_path / "untrained"), SKIP_TRAIN="1")
    assert untrained.returncode == 1
    assert untrained.stderr.splitlines()[-1] == (
        f"fairseq-generate: error: checkpoint not found: {tmp_path / 'untrained' / 'checkpoint_best.pt'}")


def logged_run(run_dir, copy_args, options):
    """RUN_DIR/train.log of a fairseq-train started with the copy task's COPY_ARGS and OPTIONS,
    its configuration logged as fairseq logs it."""
    namespace = fairseq_train_options(["--task", "copy_task", *copy_args.split(), *options])
    run_dir.mkdir(parents=True)
    (run_dir / "train.log").write_text(f"2026-01-01 00:00:00 | INFO | fairseq_cli.train | {{'_name': None, "
                                       f"'common': {{'seed': {namespace.seed}}}, 'model': {namespace!r}}}\n")


def test_transformer_quality_refuses_what_fairseq_train_would_and_runs_of_other_settings(tmp_path, monkeypatch, capsys):
    """Before any training: --memory-args fairseq-train would refuse, and a run under --out trained
    with another budget, seed or --memory-args (its score would be shown under this command)."""
    from recipes.copy import transformer_quality

    trained = []

    def train(run_dir, *args, **kwargs):
        trained.append(run_dir)
        return False  # as a failed run: nothing to read back

    monkeypatch.setattr(transformer_quality, "train_and_score", train)
    out = tmp_path / "out"
    grid = ["--lengths", "4", "--models", "K=32 mix", "--out", str(out)]

    def refused(*argv):
        error = refusal(transformer_quality.main, capsys, *grid, *argv)
        assert not trained
        return error

    assert refused("--memory-args", "--memory-kk 8") == (
        "--memory-args '--memory-kk 8': unrecognized arguments: --memory-kk 8")
    assert refused("--memory-args", "--memory-k 0") == (
        "--memory-args '--memory-k 0': argument --memory-k: invalid value 0 (must be an integer >= 1)")
    assert "No closing quotation" in refused("--memory-args", "--memory-k '8")
    assert not out.exists()

    run = out / transformer_quality.run_name(4, "K=32 mix")
    logged_run(run, "--copy-max-len 4", sweep.train_options(
        [*transformer_quality.MODELS["K=32 mix"], "--memory-k", "8", *transformer_quality.training()], 1, 6))
    same = ["--memory-args", "--memory-k 8", "--updates", "6"]
    assert "(L4_K32_mix: --max-update 6 (now 9))" in refused(*same, "--updates", "9")
    assert "(L4_K32_mix: --seed 1 (now 2))" in refused(*same, "--seed", "2")
    assert refused("--updates", "6") == (f"--out {out} holds runs trained with other settings (L4_K32_mix: "
                                         "--memory-k 8 (now 32)): give another --out, or remove those runs' folders")
    assert transformer_quality.main([*grid, *same]) == 1 and trained == [str(run)]  # the same settings: resumed


def test_transformer_quality_fails_when_a_run_fails(tmp_path, monkeypatch, capsys):
    from recipes.copy import transformer_quality

    monkeypatch.setattr(transformer_quality, "train_and_score", lambda *args, **kwargs: False)
    assert transformer_quality.main(["--out", str(tmp_path), "--lengths", "4", "--models", "transformer",
                                     "--updates", "6"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"1 run(s) failed, see their train.log and generate.log: {tmp_path / 'L4_transformer'}")


def test_sweep_fails_when_a_run_fails_and_refuses_what_it_cannot_tabulate(tmp_path, monkeypatch, capsys):
    """Exit 1 naming the failed runs; before anything: --out a file, --tables-only without a
    finished run, runs of another preset under --out."""
    monkeypatch.setattr(sweep, "train_and_score", lambda *args, **kwargs: False)
    grid = ["--preset", "tiny", "--models", "No Att", "--seeds", "1"]
    assert sweep.main([*grid, "--out", str(tmp_path / "failing")]) == 1
    run = tmp_path / "failing" / "runs" / sweep.run_name(6, "No Att", None, 1)
    assert capsys.readouterr().err.strip() == f"1 run(s) failed, see their train.log and generate.log: {run}"

    (tmp_path / "afile").write_text("")
    assert refusal(sweep.main, capsys, *grid, "--out", str(tmp_path / "afile")) == (
        f"argument --out: {tmp_path / 'afile'}: {tmp_path / 'afile'} is a file, not a folder")
    assert refusal(sweep.main, capsys, *grid, "--out", str(tmp_path / "none"), "--tables-only") == (
        f"--tables-only: no finished run of this grid (--preset tiny) in {tmp_path / 'none'}/runs to make tables of")
    assert not (tmp_path / "none").exists()

    tiny = sweep.PRESETS["tiny"]
    logged_run(tmp_path / "tiny" / "runs" / run.name, " ".join(["--copy-max-len 6", *tiny["copy"]]),
               sweep.train_options([*sweep.model_args("No Att"), *tiny["train"]], 1, 64))
    error = refusal(sweep.main, capsys, "--preset", "cpu", "--lengths", "6", "--models", "No Att", "--seeds", "1",
                    "--out", str(tmp_path / "tiny"), "--tables-only")
    assert error.startswith(f"--out {tmp_path / 'tiny'} holds runs trained with other settings ({run.name}: ")
    assert "--batch-size-valid 16 (now 64)" in error
    assert error.endswith("give another --out, or remove those runs' folders")
