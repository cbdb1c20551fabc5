#!/usr/bin/env python
"""Reproduce the paper's Table 1 and Figure 3 on the copy task.

    python -m recipes.copy.sweep --preset cpu --out results/copy/converged     # L in {20, 50, 100}, CPU
    python -m recipes.copy.sweep --preset paper --out results/copy/paper       # the paper's settings (GPU)

Every run is one call of recipes/copy/train_eval.sh (fairseq-train, fairseq-generate with beam 10
and --min-len 0, scoring). As in the paper:
  * each run trains until its validation loss stops improving (fairseq's --patience, counted in
    validations) or to the preset's cap on updates; the tables say which, and after how many updates;
  * a memory row (K = ...) selects its encoder/decoder scoring combination on validation, "the best
    out of the four scoring function combinations on the validation set" (Table 2), by successive
    halving: seed 1 of each combination trains to the preset's screening budget (--max-update
    SCREEN), the one with the lowest validation loss by then is chosen, and only that run trains on
    to convergence (it continues from its checkpoint); its other seeds use the chosen combination;
  * headline rows have several seeds (--seeds): mean, standard deviation and range.
Resumable: a run with a score.json is skipped, a run whose training finished is only decoded again,
a screen whose training stopped is not run again, and an interrupted run resumes from its
checkpoint_last.pt, its train.log appended (one whose checkpoints are gone, on a new machine,
trains again from the start, its old log kept as train.lost.log); a run under OUT whose train.log
says it was trained with other options (another preset) is refused before anything starts, so that
no table shows it under this command. Exits 1 if a run failed. Runs are ordered
so the most informative land first (see ``run_order``); the tables are rewritten after every run.
Writes OUT/table.md (headline rows), OUT/table.csv (every run), OUT/by_length.md (the headline
rows' exact-match accuracy by source length), OUT/scoring.md (all four
combinations per memory row: Fig. 3b / Fig. 5), OUT/fig3a.png (validation loss at the longest L)
and OUT/fig3b.png (the four combinations at the longest L).
"""

import argparse
import ast
import csv
import gzip
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import NamedTuple

from fairseq_memattn.score import accuracy_by_length, read_generate_output
from recipes import cli
from recipes.cli import output_dir
from recipes.copy.paper import PAPER
from recipes.train_log import plot_curves, read_train_log
from recipes.wmt17.run import fairseq_train_options

HERE = os.path.dirname(os.path.abspath(__file__))

MODELS = ["No Att", "K=1", "K=4", "K=16", "K=32", "K=64", "Att", "fairseq lstm"]
# "Att" is the paper's baseline, Bahdanau's additive attention; "fairseq lstm" is the peer our users
# train instead: fairseq's own `lstm` (its attention, input feeding) at the same sizes. Not in the
# paper; at the CPU preset additive attention learns the copy far more slowly than fairseq's
# (experiments/attention_check/).
# (encoder score, decoder score). The first is trained first: it had the best validation loss of
# the four at L = 20, K = 16 in the 3,000-update sweep (0.017, softmax/softmax 0.18).
SCORINGS = [("sigmoid", "sigmoid"), ("sigmoid", "softmax"), ("softmax", "sigmoid"), ("softmax", "softmax")]


def cpu_training(model, lr, batch, cap, patience, every):
    """fairseq-train options of a CPU preset: `model`'s sizes (the preset's), Adam with clipping at 1,
    validation (and a checkpoint) every `every` updates and none at epoch ends, so that `patience`
    counts evenly spaced validations; stop after `patience` without a new best or at `cap`."""
    units, embed = str(model["units"]), str(model["embed"])
    return ["--encoder-hidden-size", units, "--decoder-hidden-size", units,
            "--encoder-embed-dim", embed, "--decoder-embed-dim", embed, "--dropout", str(model["dropout"]),
            "--optimizer", "adam", "--lr", lr, "--clip-norm", "1", "--batch-size", str(batch),
            "--max-update", str(cap), "--patience", str(patience), "--validate-interval-updates", str(every),
            "--save-interval-updates", str(every), "--validate-interval", "1000", "--save-interval", "1000",
            "--keep-interval-updates", "1", "--cpu"]


CPU_MODEL = dict(units=128, embed=64, dropout=0)
TINY_MODEL = dict(units=8, embed=8, dropout=0)

PRESETS = {
    # Sec. 4.1: 2x256 bi-LSTM encoder, 2x256 decoder, 256-d embeddings, dropout 0.2 (the
    # architecture defaults), Adam 1e-4, batch 128, up to 200k steps, 100k/1k examples.
    "paper": dict(
        lengths=[20, 50, 100, 200], seeds=3, fig3b_k=32, copy=[], screen=20000,
        model=dict(units=256, embed=256, dropout=0.2),
        sizes="the paper's (Sec. 4.1)",
        train=["--optimizer", "adam", "--lr", "1e-4", "--batch-size", "128", "--max-update", "200000",
               "--validate-interval-updates", "2000", "--save-interval-updates", "2000",
               "--keep-interval-updates", "1"],
    ),
    # CPU: half-size model (2x128 units, 64-d embeddings), no dropout, Adam 1e-3 (10x the paper's:
    # at 3e-3 validation loss jumped up to 6x between validations and Att diverged at L = 50),
    # batch 64. Validation every 500 updates; a run stops after 5 validations (2,500 updates)
    # without a new best, or at 12,000 updates. The scoring combinations are compared at 3,000
    # updates (6 validations): at L = 20, K = 16 the four were 0.017-0.18 apart by then.
    "cpu": dict(
        lengths=[20, 50, 100], seeds=3, fig3b_k=16, copy=[], screen=3000,
        model=CPU_MODEL,
        sizes="the CPU preset's: 2x128 units, 64-d embeddings, no dropout (the paper: 2x256, 256-d, 0.2)",
        train=cpu_training(CPU_MODEL, lr="1e-3", batch=64, cap=12000, patience=5, every=500),
    ),
    # Seconds per run, for the tests: 8 units, L = 6, 512 training examples.
    "tiny": dict(
        lengths=[6], seeds=2, fig3b_k=1, screen=24, model=TINY_MODEL,
        copy=["--copy-train-size", "512", "--copy-valid-size", "64", "--copy-test-size", "32"],
        sizes="tiny (tests only): 2x8 units, 8-d embeddings",
        train=cpu_training(TINY_MODEL, lr="1e-2", batch=16, cap=64, patience=2, every=8),
    ),
}


def paper_bleu(length, model):
    return PAPER[length][model][0] if model in PAPER.get(length, {}) else ""


def format_paper_bleu(bleu):
    return f"{bleu:.2f}" if bleu != "" else ""  # 100.00 beside 99.97, as the paper prints it


def is_memory(model):
    return model.startswith("K=")


def model_args(model, scoring=None, sizes=None):
    """fairseq-train's --arch and model options of a row; sizes (a preset's `model`) for fairseq's
    lstm, whose defaults are not the paper's: 2 layers, a bidirectional encoder, our sizes."""
    if model == "fairseq lstm":
        units, embed = str(sizes["units"]), str(sizes["embed"])
        return ["--arch", "lstm", "--encoder-bidirectional", "--encoder-layers", "2", "--decoder-layers", "2",
                "--encoder-embed-dim", embed, "--decoder-embed-dim", embed, "--encoder-hidden-size", units,
                "--decoder-hidden-size", units, "--decoder-out-embed-dim", units, "--dropout", str(sizes["dropout"])]
    if model == "No Att":
        return ["--arch", "lstm_noatt"]
    if model == "Att":
        return ["--arch", "lstm_att"]
    return ["--arch", "lstm_memattn", "--memory-k", model.split("=")[1],
            "--memory-encoder-score", scoring[0], "--memory-decoder-score", scoring[1]]


class Run(NamedTuple):
    """One fairseq-train run of the sweep. scoring: None (no memory), (encoder, decoder), or
    "chosen" until the screens of its (L, model) have ended. A screen is seed 1 of one combination
    trained to the screening budget only; the chosen combination's seed-1 run continues it."""
    length: int
    model: str
    scoring: object
    seed: int
    screen: bool = False


def run_name(length, model, scoring, seed):
    """A run's directory; a screen and its continuation share it."""
    name = f"L{length}_{model.replace(' ', '').replace('=', '')}"
    if scoring:
        name += f"_{scoring[0]}-{scoring[1]}"
    return f"{name}_s{seed}"


def run_order(lengths, models, seeds, fig3b_k, scorings=SCORINGS):
    """Runs in the order they are trained.

    1. Longest L, seed 1: K = fig3b_k's screens (Fig. 3b) and its chosen run, fairseq lstm, No Att,
       every other K's screens and chosen run, largest K first (the rows that decide whether memory
       attention matches attention).
    2. The other lengths, seed 1, shortest first, in the same order (the cheapest runs: does any
       row collapse?).
    3. Att, seed 1, longest L first: the slowest to train (about 7 hours at L = 100 on the CPU
       preset), so it does not hold up the rest of the table's first version.
    4. Seeds 2..: the headline rows' spread, longest L first.
    """
    def memory_row(length, model):
        return [Run(length, model, s, 1, screen=True) for s in scorings] + [Run(length, model, "chosen", 1)]

    def seed1(length):
        memory = [m for m in models if is_memory(m)]
        lead = [m for m in memory if m == f"K={fig3b_k}"]
        runs = [run for m in lead for run in memory_row(length, m)]
        runs += [Run(length, m, None, 1) for m in ("fairseq lstm", "No Att") if m in models]
        rest = sorted((m for m in memory if m not in lead), key=lambda m: -int(m.split("=")[1]))
        return runs + [run for m in rest for run in memory_row(length, m)]

    def more_seeds(length):
        return [Run(length, m, "chosen" if is_memory(m) else None, seed) for seed in seeds[1:] for m in models]

    longest, shorter = max(lengths), sorted(set(lengths) - {max(lengths)})
    order = seed1(longest) + [run for length in shorter for run in seed1(length)]
    order += [Run(length, "Att", None, 1) for length in [longest, *shorter] if "Att" in models]
    return order + [run for length in [longest, *shorter] for run in more_seeds(length)]


def read_run(run_dir):
    with open(os.path.join(run_dir, "score.json")) as f:
        result = json.load(f)
    result.update(read_train_log(os.path.join(run_dir, "train.log")))
    with open(os.path.join(run_dir, "generate.log")) as f:
        m = re.search(r"Translated [\d,]+ sentences .* in ([\d.]+)s", f.read())
    result["decode_seconds"] = float(m.group(1)) if m else math.nan
    # train_eval.sh compresses the output once it is scored; runs made before that kept plain text.
    plain = os.path.join(run_dir, "generate.test.txt")
    with (open(plain) if os.path.exists(plain) else gzip.open(plain + ".gz", "rt")) as f:
        result["outputs"] = read_generate_output(f)  # (hypotheses, references)
    return result


def read_screen(run_dir, budget):
    """A screen's training log, with its best validation loss within the screening budget (a run
    that has since trained on is judged on the same updates as the others)."""
    result = read_train_log(os.path.join(run_dir, "train.log"))
    within = [loss for updates, loss in result["curve"] if updates <= budget]
    result["screen_loss"] = min(within) if within else math.nan
    result["curve"] = [(u, loss) for u, loss in result["curve"] if u <= budget]
    return result


def screen_ended(run_dir, budget):
    """Whether a screen has ended: its training stopped (at the budget, or earlier by --patience),
    or it has validated at the budget, which is the case while its continuation trains on (a sweep
    interrupted then must not run the screen again: fairseq would resume at the continuation's
    checkpoint, do one more update and stop)."""
    log = os.path.join(run_dir, "train.log")
    if not os.path.exists(log):
        return False
    info = read_train_log(log)
    return info["stopped"] is not None or info["updates"] >= budget


def train_options(train_args, seed, cap):
    """What train_and_score passes on to fairseq-train (train_eval.sh adds the task and the folder)."""
    return [*train_args, "--max-update", str(cap), "--seed", str(seed), "--no-progress-bar", "--log-interval", "100"]


def logged_options(log):
    """The options of the last fairseq-train process in a train.log, which resumed any before it
    (fairseq logs them all as it starts, in its configuration's 'model' Namespace); {} if none."""
    options = {}
    with open(log, errors="replace") as f:
        for line in f:
            if "| fairseq_cli.train | {" not in line:
                continue
            try:
                config = ast.parse(line[line.index("{"):], mode="eval").body
            except SyntaxError:
                continue
            for key, value in zip(config.keys, config.values):
                if isinstance(key, ast.Constant) and key.value == "model" and isinstance(value, ast.Call):
                    options = {}
                    for keyword in value.keywords:
                        try:
                            options[keyword.arg] = ast.literal_eval(keyword.value)
                        except ValueError:
                            pass
    return options


# Where the run is kept (train_eval.sh's own options) and the machine it ran on (fairseq's
# defaults count its GPUs), not what the driver trains.
PLACE_OPTIONS = re.compile(r"save_dir|user_dir|no_epoch_checkpoints|distributed_\w+|nprocs_per_node|device_id")


def changed_options(run_dir, copy_args, options, ignore=()):
    """What RUN_DIR/train.log's fairseq-train was given other than the copy task's COPY_ARGS and
    OPTIONS (train_options') give now, as recipes.cli.changed's "--max-update 2000 (now 9999)", the
    first 3 of them; "" where nothing differs or nothing was logged. An option the log does not
    mention (added to fairseq_memattn since) counts as the same. ValueError: options fairseq-train
    refuses."""
    planned = vars(fairseq_train_options(["--task", "copy_task", *copy_args.split(), *options]))
    log = os.path.join(run_dir, "train.log")
    logged = logged_options(log) if os.path.exists(log) else {}
    compared = {key: value for key, value in logged.items() if not PLACE_OPTIONS.fullmatch(key) and key not in ignore}
    return cli.changed(compared, planned, most=3)


def refuse_changed(parser, out, changed):
    """parser.error where runs under OUT were trained with other options: CHANGED, {run folder:
    changed_options'} (a table must not show them under this command)."""
    changed = {name: settings for name, settings in changed.items() if settings}
    if changed:
        name, settings = next(iter(changed.items()))
        more = f"; and {len(changed) - 1} more runs" if len(changed) > 1 else ""
        parser.error(f"--out {out} holds runs trained with other settings ({name}: {settings}"
                     f"{more}): give another --out, or remove those runs' folders")


def report_failed(run_dirs):
    """Names the runs that failed, and where their logs are; the exit status: 1 if any did."""
    if not run_dirs:
        return 0
    print(f"{len(run_dirs)} run(s) failed, see their train.log and generate.log: {', '.join(run_dirs)}",
          file=sys.stderr, flush=True)
    return 1


def train_and_score(run_dir, copy_args, train_args, seed, cap, decode=True):
    """One run through train_eval.sh (copy_args: the task's options, a string; train_args:
    fairseq-train's, training up to `cap` updates); decode=False trains only (a screen). False if
    it failed (a sweep goes on, a restart retries it)."""
    log = os.path.join(run_dir, "train.log")
    info = read_train_log(log) if os.path.exists(log) else {"stopped": None}
    # A screen stopped at its budget has not finished training: its continuation resumes it.
    trained = info["stopped"] == "converged" or (info["stopped"] == "cap" and info["updates"] >= cap)
    # The checkpoints are not committed: on a new machine a run that has not been decoded has its
    # train.log but not the checkpoint it would go on from. It trains again from the start, its old
    # log kept aside, so that train.log holds one training (same seed and data, but another CPU's
    # floating point: the curve differs a little, and its screen is judged on the new one).
    if os.path.exists(log) and not os.path.exists(
            os.path.join(run_dir, "checkpoint_best.pt" if trained else "checkpoint_last.pt")):
        os.replace(log, os.path.join(run_dir, "train.lost.log"))
        trained = False
    print(f"== {os.path.basename(run_dir)}: {'decoding' if trained else 'training'}", flush=True)
    # train_eval.sh calls fairseq-train, fairseq-generate and python: this interpreter's, so that a
    # driver started as .venv/bin/python needs no activated venv.
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = {**os.environ, "PATH": path, "COPY_ARGS": copy_args, "SKIP_TRAIN": "1" if trained else "",
           "SKIP_GENERATE": "" if decode else "1"}
    command = [os.path.join(HERE, "train_eval.sh"), run_dir, *train_options(train_args, seed, cap)]
    # Each line says whose it is: with --jobs, several runs print at once.
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        for line in process.stdout:
            print(f"{os.path.basename(run_dir)}: {line}", end="", flush=True)
    if process.returncode != 0:
        print(f"== {os.path.basename(run_dir)}: FAILED (see its train.log / generate.log)", flush=True)
        return False
    return True


def choose_scoring(screens, length, model):
    """The combination whose screen has the lowest validation loss within the budget, among the
    screens of (length, model) that have ended."""
    done = {s: r for (L, m, s), r in screens.items() if (L, m) == (length, model)}
    return min(done, key=lambda s: done[s]["screen_loss"]) if done else None


def spread(values, with_range=True):
    if not values:
        return ""
    mean = statistics.mean(values)
    if len(values) == 1:
        return f"{mean:.2f}"
    value_range = f" ({min(values):.2f}-{max(values):.2f})" if with_range else ""
    return f"{mean:.2f} ± {statistics.stdev(values):.2f}{value_range}"


def headline_rows(results, screens, lengths, models):
    rows = []
    for length in sorted(lengths):
        for model in models:
            scoring = choose_scoring(screens, length, model) if is_memory(model) else None
            if is_memory(model) and scoring is None:
                continue
            runs = [r for (L, m, s, _), r in sorted(results.items(), key=lambda kv: kv[0][3])
                    if L == length and m == model and s == scoring]
            if not runs:
                continue
            n_scorings = sum((L, m) == (length, model) for L, m, _ in screens)
            rows.append(dict(
                L=length, model=model, runs=runs,
                scoring=f"{scoring[0]}/{scoring[1]} (of {n_scorings})" if scoring else "",
                bleu=spread([r["bleu"] for r in runs]),
                accuracy=spread([r["accuracy"] for r in runs]),
                stopped=", ".join(f"{r['stopped']} at {r['updates']}" for r in runs),
                valid_loss=", ".join(f"{r['best_valid_loss']:.3f}" for r in runs),
                decode=spread([r["decode_seconds"] for r in runs]),
                paper=format_paper_bleu(paper_bleu(length, model))))
    return rows


def paper_layout(headline, lengths, models):
    """The headline rows laid out as the paper's Table 1 (a row per model, a column per L, the paper's
    BLEU beside ours): test BLEU, mean ± standard deviation over seeds, and in brackets the mean
    exact-match accuracy %."""
    cells = {(r["L"], r["model"]): r for r in headline}

    def cell(r):
        if r is None:
            return ""
        bleu = spread([run["bleu"] for run in r["runs"]], with_range=False)
        return f"{bleu} ({statistics.mean(run['accuracy'] for run in r['runs']):.1f})"

    lines = ["| model | " + " | ".join(f"L = {L} | paper" for L in sorted(lengths)) + " |",
             "|---|" + "---|---|" * len(lengths)]
    for model in models:
        if not any((L, model) in cells for L in lengths):
            continue
        lines.append(f"| {model} | " + " | ".join(f"{cell(cells.get((L, model)))} | "
                                                  f"{format_paper_bleu(paper_bleu(L, model))}"
                                                  for L in sorted(lengths)) + " |")
    return "\n".join(lines) + "\n"


def write_tables(out, results, screens, lengths, models, preset, command):
    chosen = {(L, m): choose_scoring(screens, L, m) for L in lengths for m in models if is_memory(m)}
    fields = ["L", "model", "encoder_score", "decoder_score", "seed", "screen_valid_loss", "chosen", "bleu",
              "accuracy", "stopped", "updates", "best_update", "best_valid_loss", "train_seconds",
              "decode_seconds", "paper_bleu"]
    rows = {key: {"screen_valid_loss": r["screen_loss"]} for key, r in
            ((key + (1,), r) for key, r in screens.items())}
    for key, r in results.items():
        rows.setdefault(key, {}).update(
            bleu=r["bleu"], accuracy=r["accuracy"], stopped=r["stopped"], updates=r["updates"],
            best_update=r["best_update"], best_valid_loss=r["best_valid_loss"],
            train_seconds=round(r["train_seconds"]), decode_seconds=r["decode_seconds"])
    with open(os.path.join(out, "table.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for (L, m, s, seed), row in sorted(rows.items(), key=lambda kv: (kv[0][0], MODELS.index(kv[0][1]),
                                                                         str(kv[0][2]), kv[0][3])):
            writer.writerow(dict(L=L, model=m, encoder_score=s[0] if s else "", decoder_score=s[1] if s else "",
                                 seed=seed, chosen=int(s is None or chosen.get((L, m)) == s),
                                 paper_bleu=paper_bleu(L, m), **row))

    settings = PRESETS[preset]
    headline = headline_rows(results, screens, lengths, models)
    header = (f"Made by `{command}`.\n\nModel sizes: {settings['sizes']}. Training: "
              f"`{' '.join(settings['train'])}`; decoding: beam 10, `--min-len 0`, the checkpoint with the "
              f"best validation loss, on the test split. 'converged' = stopped by `--patience` "
              f"(no better validation loss for that many validations), 'cap' = stopped by `--max-update`.\n\n")
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("# Table 1 (copy task): test BLEU\n\n" + header)
        f.write(f"Memory rows: the scoring combination (encoder/decoder) with the best validation loss after "
                f"{settings['screen']} updates of seed 1, among the ones screened (of n); see scoring.md for "
                "all four. BLEU and accuracy: mean ± standard deviation (min-max) over seeds.\n\n")
        f.write("| L | model | scoring | seeds | BLEU | accuracy % | stopped at updates | best valid loss "
                "| decode s | paper BLEU |\n|---|---|---|---|---|---|---|---|---|---|\n")
        for r in headline:
            f.write(f"| {r['L']} | {r['model']} | {r['scoring']} | {len(r['runs'])} | {r['bleu']} | "
                    f"{r['accuracy']} | {r['stopped']} | {r['valid_loss']} | {r['decode']} | {r['paper']} |\n")
        f.write("\nThe same rows as the paper lays out Table 1: test BLEU, mean ± standard deviation over "
                "the seeds above (in brackets the mean exact-match accuracy %), the paper's BLEU beside.\n\n"
                + paper_layout(headline, lengths, models))

    with open(os.path.join(out, "by_length.md"), "w") as f:
        f.write("# Exact-match accuracy (%) by source length, test split\n\n" + header)
        f.write("Each headline row of table.md (its seeds' outputs pooled); bands of L/5 lengths, the last "
                "ending at L. A memory of K contexts holds |S|/K tokens per context: where that "
                "runs out, accuracy falls with length. (+n): n % more hold the source's tokens in another "
                "order.\n")
        for L in sorted(lengths):
            rows = [r for r in headline if r["L"] == L]
            if not rows:
                continue
            width = max(1, L // 5)
            bands = [f"{b * width}-{(b + 1) * width - 1}" for b in range(L // width + 1)]
            last = (L // width) * width  # the last band ends at L: "100", not "100-119"
            labels = bands[:-1] + [f"{last}-{L}" if last < L else str(L)]
            f.write(f"\n| L = {L} | scoring | seeds | " + " | ".join(labels) + " |\n|---|---|---|"
                    + "---|" * len(bands) + "\n")
            for r in rows:
                hypotheses = [h for run in r["runs"] for h in run["outputs"][0]]  # the seeds pooled
                references = [ref for run in r["runs"] for ref in run["outputs"][1]]
                found = {band["lengths"]: band for band in accuracy_by_length(hypotheses, references, width)}
                cells = [f"{100.0 * found[b]['exact'] / found[b]['sentences']:.1f} "
                         f"(+{100.0 * found[b]['reordered'] / found[b]['sentences']:.1f})" if b in found else ""
                         for b in bands]
                f.write(f"| {r['model']} | {r['scoring']} | {len(r['runs'])} | " + " | ".join(cells) + " |\n")

    with open(os.path.join(out, "scoring.md"), "w") as f:
        f.write("# Scoring functions (Fig. 3b, Fig. 5): seed 1, every encoder/decoder combination\n\n" + header)
        f.write(f"Each cell: the best validation loss within the first {settings['screen']} updates (the "
                "screen; 'converged' if it stopped earlier by --patience); **bold** = chosen, trained on: "
                "→ its best validation loss / test BLEU (stopped at updates).\n\n")
        f.write("| L | model | " + " | ".join(f"{e}/{d}" for e, d in SCORINGS) + " |\n")
        f.write("|---|---|" + "---|" * len(SCORINGS) + "\n")
        for L in sorted(lengths):
            for m in models:
                if not is_memory(m) or not any((L, m, s) in screens for s in SCORINGS):
                    continue
                cells = []
                for s in SCORINGS:
                    screen, final = screens.get((L, m, s)), results.get((L, m, s, 1))
                    cell = ""
                    if screen:
                        cell = f"{screen['screen_loss']:.3f}"
                        if screen["updates"] < settings["screen"] and screen["stopped"] == "converged":
                            cell += f" (converged at {screen['updates']})"
                    if screen and chosen[(L, m)] == s:
                        cell = f"**{cell}**"
                        if final:
                            cell += (f" → {final['best_valid_loss']:.3f} / {final['bleu']:.2f} "
                                     f"({final['stopped']} at {final['updates']})")
                    cells.append(cell)
                f.write(f"| {L} | {m} | " + " | ".join(cells) + " |\n")


def write_figures(out, results, screens, lengths, models, fig3b_k, budget):
    longest = max(lengths)
    fig3a = {}
    for m in models:
        scoring = choose_scoring(screens, longest, m) if is_memory(m) else None
        r = results.get((longest, m, scoring, 1))
        if r:
            fig3a[f"{m}" + (f" ({scoring[0]}/{scoring[1]})" if scoring else "")] = r["curve"]
    fig3b = {f"encoder {s[0]}, decoder {s[1]} ({r['screen_loss']:.3f})": r["curve"]
             for s in SCORINGS for r in [screens.get((longest, f"K={fig3b_k}", s))] if r}
    if fig3a:
        plot_curves(os.path.join(out, "fig3a.png"), f"Fig. 3a: copy task, L = {longest}, seed 1", fig3a)
    if fig3b:
        plot_curves(os.path.join(out, "fig3b.png"),
                    f"Fig. 3b: scoring functions, L = {longest}, K = {fig3b_k}, seed 1,\nfirst {budget} updates",
                    fig3b)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--out", type=output_dir, default="results/copy/converged")
    parser.add_argument("--lengths", type=int, nargs="+", help="override the preset's lengths")
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--scorings", nargs="+", default=[f"{e}/{d}" for e, d in SCORINGS],
                        choices=[f"{e}/{d}" for e, d in SCORINGS],
                        help="encoder/decoder scoring combinations to select from (default: all four)")
    parser.add_argument("--seeds", type=int, nargs="+",
                        help="training seeds (default: 1..the preset's count); the first selects the scoring")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs trained at once (e.g. one per core, each with OMP_NUM_THREADS=1)")
    parser.add_argument("--tables-only", action="store_true",
                        help="train nothing: rewrite the tables and figures from the runs finished under "
                             "--out (e.g. after parts of the grid ran with narrower --models or --lengths)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs: {args.jobs} (must be >= 1)")
    preset = PRESETS[args.preset]
    lengths = args.lengths or preset["lengths"]
    bad = [n for n in lengths if n < 1]
    if bad:
        parser.error(f"--lengths: {bad} (must be >= 1; the paper's grid is {sorted(PAPER)})")
    seeds = args.seeds or list(range(1, preset["seeds"] + 1))
    if seeds[0] != 1 or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds: {seeds} (must start with 1, which selects the scoring, and not repeat)")
    models = [m for m in MODELS if m in args.models]
    scorings = [s for s in SCORINGS if f"{s[0]}/{s[1]}" in args.scorings]
    # The tables name the sweep that trains them, not the call that only rewrote them.
    command = shlex.join(["python", "-m", "recipes.copy.sweep",
                          *(a for a in (sys.argv[1:] if argv is None else argv) if a != "--tables-only")])
    train_args = preset["train"]
    cap = int(train_args[train_args.index("--max-update") + 1])

    results, screens = {}, {}

    def run_dir(run):
        return os.path.join(args.out, "runs", run_name(*run[:4]))

    def options(run):
        """The copy task's options (a string) and fairseq-train's of a run, but its cap and seed."""
        return (" ".join([f"--copy-max-len {run.length}", *preset["copy"]]),
                [*model_args(run.model, run.scoring, preset["model"]), *train_args])

    def execute(run):
        copy_args, train = options(run)
        return train_and_score(run_dir(run), copy_args, train, run.seed,
                               cap=preset["screen"] if run.screen else cap, decode=not run.screen)

    def done(run):
        if not run.screen:
            return os.path.exists(os.path.join(run_dir(run), "score.json"))
        return screen_ended(run_dir(run), preset["screen"])

    def record(run):
        if run.screen:
            screens[run[:3]] = read_screen(run_dir(run), preset["screen"])
        else:
            results[run[:4]] = read_run(run_dir(run))
        write_tables(args.out, results, screens, lengths, models, args.preset, command)  # progress stays visible
        write_figures(args.out, results, screens, lengths, models, preset["fig3b_k"], preset["screen"])

    runs = run_order(lengths, models, seeds, preset["fig3b_k"], scorings)
    # Before anything trains or a table is written: a run under --out trained with other options
    # (another preset) would be resumed, or shown under this command.
    changed = {}
    for run in runs:
        for scoring in scorings if run.scoring == "chosen" else [run.scoring]:
            concrete = run._replace(scoring=scoring)
            if os.path.isdir(run_dir(concrete)):
                copy_args, train = options(concrete)
                # a screen and its continuation share the folder, each with its own --max-update
                ignore = ["max_update"] if is_memory(run.model) and run.seed == 1 else []
                changed[run_name(*concrete[:4])] = changed_options(
                    run_dir(concrete), copy_args, train_options(train, run.seed, cap), ignore)
    refuse_changed(parser, args.out, changed)
    failed = run_all(runs, 0 if args.tables_only else args.jobs, execute, record, scorings, done=done,
                     choose=lambda length, model: choose_scoring(screens, length, model))
    if args.tables_only and not (results or screens):
        parser.error(f"--tables-only: no finished run of this grid (--preset {args.preset}) in {args.out}/runs "
                     "to make tables of")
    if results or screens:
        print(open(os.path.join(args.out, "table.md")).read())
    return report_failed([run_dir(run) for run in failed])


def run_all(runs, jobs, execute, record, scorings, done, choose):
    """Runs `runs` (run_order's) with up to `jobs` at once, each started in that order as soon as
    it can be: a "chosen" run waits until the screens of its (L, model) have ended in every
    combination of `scorings`, then takes choose(L, model). execute(run) trains (and scores)
    (False: failed); record(run) reads a finished run. Runs done already are recorded first,
    wherever they are in the order (so the tables show every finished run from the start), and
    not run again; with jobs = 0 nothing else is. Returns the runs that failed."""
    pending, ended, failed = list(runs), set(), []
    waiting = object()

    def resolve(run):
        """The run with its scoring: `waiting` while its screens train, None if none to choose."""
        if run.scoring != "chosen":
            return run
        if any(Run(run.length, run.model, s, 1, screen=True) not in ended for s in scorings):
            return waiting
        scoring = choose(run.length, run.model)
        if scoring is None:
            print(f"== L{run.length} {run.model} seed {run.seed}: no screen to choose a scoring from, skipped",
                  flush=True)
            return None
        return run._replace(scoring=scoring)

    def take(run, only_done):
        """Resolves a pending run; records it if it is done already. The run to start, or None."""
        resolved = resolve(run)
        if resolved is waiting:
            return None
        if resolved is None or done(resolved):
            pending.remove(run)
            if resolved:
                print(f"== {run_name(*resolved[:4])}{' (screen)' if resolved.screen else ''}: done already, "
                      "skipped", flush=True)
                ended.add(resolved)
                record(resolved)
            return None
        if only_done:
            return None
        pending.remove(run)
        return resolved

    for run in list(pending):  # in order: a row's screens come before its chosen runs
        take(run, only_done=True)
    if jobs == 0:
        return failed
    with ThreadPoolExecutor(jobs) as pool:
        running = {}
        while pending or running:
            pending_before = len(pending)
            for run in list(pending):
                if len(running) == jobs:
                    break
                resolved = take(run, only_done=False)
                if resolved:
                    running[pool.submit(execute, resolved)] = resolved
            if not running:
                if len(pending) == pending_before:  # nothing could start, and nothing will end
                    raise RuntimeError(f"runs waiting for screens outside the sweep: {pending}")
                continue  # the runs left were waiting for one recorded just now
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                run = running.pop(future)
                ended.add(run)
                if future.result():
                    record(run)
                else:
                    failed.append(run)
    return failed


if __name__ == "__main__":
    sys.exit(main())
