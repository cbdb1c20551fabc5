#!/usr/bin/env python
"""Quality at convergence on a CPU: fairseq's ``transformer`` against ``transformer_memattn`` (K = 64,
the architecture's defaults) on the Bible en-fr data, side by side on one thread each, each until its
validation loss has not improved for --patience (5) epochs and then decoded at once (best checkpoint
and the average of the last epochs'), the test split from the best checkpoints timed one at a time once
both have stopped; then the converged transformer converted to transformer_memattn and fine-tuned for
5 % and 10 % of its updates, all parameters and the write alone, beside the transformer continued as
long (``recipes/convert/run.py``); the table and curves in results/bible/converged/.
``--pair lstm`` trains ``lstm_att`` against ``lstm_memattn`` (Table 2's setting) and the variant the
LSTM gap's diagnosis points to, the same way (results/bible/converged/cpu_lstm/).

    nohup nice -n 10 python -m recipes.bible.converge_cpu --data DATA > converge_cpu.log 2>&1 &

Safe to run again at any time: while a copy with the same --work (or a fairseq-train it started)
runs, another exits at once; a new one resumes each model from its checkpoint_last.pt and skips what
is done. ``--jobs N`` trains at most N models at once (the LSTM trio on two cores: ``--jobs 2``).
``--models`` trains some of them, or a variant, with a driver of its own beside the pair's (another
--work, the same --out: one table shows them all). Pause every driver's training with
``pkill -STOP -f fairseq_cli.train`` and go on with ``pkill -CONT -f fairseq_cli.train``. The table
and the curves are written again after every round of epochs, so they grow as training goes;
``--report`` writes them from the logs so far at any time, also while a run goes on. A driver times
the test decoding of its own models one at a time, not what another driver trains beside it.
"""

import argparse
import fcntl
import os
import pathlib
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
from argparse import Namespace

from fairseq_memattn.arg_types import positive_int, positive_number
from fairseq_memattn.staging import replace_atomically
from recipes.bible import compare, converge, converge_settings, converged_table, lstm_gap
from recipes.bible.options import prepared
from recipes.cli import output_dir, refuse_duplicates
from recipes.convert import run as convert_run
from recipes.train_log import plot_curves, read_train_log, run_logged

# What --pair trains: the baseline first, then memory attention. The LSTMs add the variant whose
# position encodings are renormalised to a mean of 1, which the LSTM gap's diagnosis points to.
PAIRS = {"transformer": ("transformer", "transformer_memattn"),
         "lstm": ("lstm_att", "lstm_memattn", "lstm_memattn_position_mean")}
# compare.py's models at half their width, so that a pair converges within hours on two cores
# (docs/wmt17.md has the estimates); the Transformers with less dropout for the smaller model.
CPU_SIZES = {"transformer": ["--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
                             "--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512", "--dropout", "0.1"],
             "lstm": ["--encoder-hidden-size", "128", "--decoder-hidden-size", "128", "--encoder-embed-dim", "128",
                      "--decoder-embed-dim", "128"]}
SETTINGS = {"transformer": "recipes/bible/compare.py's small Transformer at half its width (3 + 3 layers of 128 "
                           "units, 4 heads, FFN 512), dropout 0.1, batches of 4,096 tokens, Adam with the inverse "
                           "square root schedule (lr 1e-3, 1,000 warm-up updates), label smoothing 0.1; "
                           "transformer_memattn with K = 64 and its defaults",
            "lstm": "recipes/bible/compare.py's LSTMs at half their width (2 + 2 layers of 128 units, "
                    "embeddings of 128), dropout 0.2, batches of 64 sentences, Adam (lr 1e-3), gradients clipped "
                    "at 1; lstm_memattn with Table 2's setting (K = 64, position encodings, sigmoid / softmax), "
                    "its variants with the options of the diagnosis table's column changed"}
DEFAULT_WORK = {"transformer": os.path.join(compare.REPO, "checkpoints", "bible", "converged"),
                "lstm": os.path.join(compare.REPO, "checkpoints", "bible", "converged_lstm")}
DEFAULT_OUT = {"transformer": os.path.join(compare.REPO, "results", "bible", "converged"),
               "lstm": os.path.join(compare.REPO, "results", "bible", "converged", "cpu_lstm")}


def driver_command(pair, models=None, work=None):
    option = "" if pair == "transformer" else f" --pair {pair}"
    if models and list(models) != list(PAIRS[pair]):
        option += " --models " + " ".join(models)
    option += " --data DATA" + (f" --work {work}" if work else "")
    return f"nohup nice -n 10 python -m recipes.bible.converge_cpu{option} > converge_cpu.log 2>&1 &"


def driver_commands(pair, models):
    """The command lines that trained MODELS (those with a log under --out): the pair's driver, and
    for models beyond the pair one beside it, with a --work of its own (each driver locks its --work)."""
    pair_models = [m for m in models if m in PAIRS[pair]]
    beside = [m for m in models if m not in PAIRS[pair]]
    return ([driver_command(pair, pair_models)] if pair_models else []) + (
        [driver_command(pair, beside, "WORK2")] if beside else [])


def epochs_since_best(curve):
    """Validations (one an epoch) after the one with the lowest loss."""
    if not curve:
        return 0
    losses = [loss for _, loss in curve]
    return len(losses) - 1 - losses.index(min(losses))


def stop_reason(curve, args):
    """Why training of a model with this validation curve is over: "converged" (--patience epochs
    without a better loss), "max-epoch", or None (it goes on)."""
    if epochs_since_best(curve) >= args.patience:
        return "converged"
    return "max-epoch" if len(curve) >= args.max_epoch else None


def stage_dir(args):
    """Each model's log, hypotheses and diagnosis, in a folder of its own."""
    return os.path.join(args.out, "cpu")


def log_path(args, model):
    return os.path.join(stage_dir(args), model, "train.log")


def checkpoint_dir(args, model):
    return os.path.join(args.work, "checkpoints", model)


def best_checkpoint(args, model):
    return os.path.join(checkpoint_dir(args, model), "checkpoint_best.pt")


def logged_curve(args, model):
    """MODEL's validation curve so far, [(updates, loss)] (one point an epoch); [] before its log."""
    log = log_path(args, model)
    return read_train_log(log)["curve"] if os.path.isfile(log) else []


def epochs_validated(args, model):
    """The epochs of MODEL's log with a validation (train counts them so too: one an epoch)."""
    return len(logged_curve(args, model))


def orphaned_log(args, model):
    """Why MODEL's log cannot be resumed (its run unfinished, and --work without the checkpoint it
    ended with, as on a new machine), or None: fairseq-train would start again from scratch while
    the patience count went on from the log."""
    log, curve = log_path(args, model), logged_curve(args, model)
    if not curve or stop_reason(curve, args):
        return None
    if os.path.isfile(os.path.join(checkpoint_dir(args, model), "checkpoint_last.pt")):
        return None
    return (f"--out {args.out}: {log} has {len(curve)} epochs, but --work {args.work} has no "
            f"{os.path.join('checkpoints', model, 'checkpoint_last.pt')} to go on from: give the --work of "
            "that run, or move its log away to start again")


def run_fairseq(command, log, lock):
    """run_logged, with the driver's lock file descriptor passed on, so that the lock stays held
    while any fairseq-train it started still runs."""
    return run_logged(command, log, pass_fds=(lock,)) == 0


def train(args, model, lock, on_round):
    """Epoch rounds of fairseq-train until --patience epochs without a better validation loss.

    fairseq's own --patience counts from the first validation of each process, so a resumed run
    would forget how long it had gone without improving: the count is kept here, from the log."""
    log = log_path(args, model)
    os.makedirs(os.path.dirname(log), exist_ok=True)
    while True:
        curve = logged_curve(args, model)
        if stop_reason(curve, args):
            return True
        # No stop can come before patience - waited more epochs: one fairseq-train runs them all.
        epochs = min(len(curve) + args.patience - epochs_since_best(curve), args.max_epoch)
        options = [*CPU_SIZES[args.pair], "--cpu", "--keep-last-epochs", str(converge_settings.AVERAGE_LAST),
                   "--max-epoch", str(epochs), *args.train_args]
        command = converge.train_command(model, os.path.join(args.data, "data-bin"), checkpoint_dir(args, model),
                                         args.seed, options)
        if not run_fairseq(command, log, lock):
            converge.log(f"{model}: fairseq-train failed, see {log}")
            return False
        if len(logged_curve(args, model)) == len(curve):  # --work's checkpoint ahead of the log
            converge.log(f"{model}: fairseq-train validated no new epoch: --work {args.work} holds a checkpoint "
                         f"at or past --max-epoch {epochs} (validations in {log}: {len(curve)}); give the "
                         "--out of that run, or another --work")
            return False
        on_round()


def decoding_settings(args):
    """converge.evaluate's settings: on the CPU, no deadline."""
    return Namespace(bundle=args.data, cpu=True, generate_args="", deadline=None)


def decoded(args, model):
    """Whether MODEL's outputs are there and from its checkpoint_best.pt as it is now (training
    resumed with another --patience or --max-epoch may have moved it)."""
    folder = os.path.join(stage_dir(args), model)
    parts = ("best/hyp.valid.fr", "average/hyp.test.fr" if converge.tested(model) else "average/hyp.valid.fr")
    if not all(os.path.isfile(os.path.join(folder, part)) for part in parts):
        return False
    updates, best = converged_table.decoded_best(folder), best_checkpoint(args, model)
    # None: decoded before the update was kept
    return updates is None or not os.path.isfile(best) or updates == convert_run.saved_updates(best)


def decode(args, model):
    """Valid from the best checkpoint and valid and test from the average of the last epochs' (not
    ``converge.tested``: valid only); a memory LSTM's memory read on valid and its attention drawn
    (converge.diagnose). Run as soon as the model has stopped, beside the others' training; outputs
    of an earlier best checkpoint are removed first."""
    stage = stage_dir(args)
    if decoded(args, model):
        return
    for part in ("best", "average"):
        shutil.rmtree(os.path.join(stage, model, part), ignore_errors=True)
    settings = decoding_settings(args)
    converge.decode(settings, stage, args.work, model)
    if model in converge_settings.LSTM_MODELS:
        converge.diagnose(settings, stage, args.work, model)
    converged_table.compress_outputs(os.path.join(stage, model))


def decode_test_alone(args, model):
    """Test from the best checkpoint, once every model has stopped, one model at a time: the driver
    runs nothing beside it, so that the models' ms / token compare."""
    folder = os.path.join(stage_dir(args), model, "best")
    if (not converge.tested(model) or os.path.isfile(os.path.join(folder, "evaluate.test.json"))
            or not os.path.isfile(best_checkpoint(args, model))):
        return
    converge.evaluate(decoding_settings(args), best_checkpoint(args, model), "test", folder)
    converged_table.compress_outputs(folder)


def train_and_decode(args, model, lock, on_round):
    """train, then decode at once: the core a model frees decodes it while the others still train."""
    if not train(args, model, lock, on_round):
        return False
    decode(args, model)
    on_round()
    return True


def conversion_settings(args):
    """recipes/convert/run.py's arguments for the converged transformer's best checkpoint."""
    return Namespace(data=args.data, source=best_checkpoint(args, "transformer"),
                     work=os.path.join(args.work, "convert"), out=os.path.join(args.out, "convert"),
                     fractions=args.convert_fractions, write_only_updates=0, seed=args.seed,
                     extra=[*CPU_SIZES["transformer"], *args.train_args], run=None)


def conversion_command(settings, *step):
    return [sys.executable, "-m", "recipes.convert.run", *step, "--data", settings.data, "--source",
            settings.source, "--work", settings.work, "--out", settings.out, "--fractions",
            *map(str, settings.fractions), *settings.extra]


def conversion_runs(settings, updates):
    """(run name, recipes/convert/run.py train's options) of the fine-tunings: all parameters, the write
    alone for the largest fraction, and the transformer continued."""
    write_only = max(convert_run.totals(updates, settings.fractions)) - updates
    return [("converted", ["converted"]),
            (convert_run.run_name("converted", write_only), ["converted", "--write-only-updates", str(write_only)]),
            ("original", ["original"])]


def convert(args, lock):
    """Convert, then the fine-tunings of ``conversion_runs``, side by side."""
    settings = conversion_settings(args)
    subprocess.run(conversion_command(settings, "convert"), check=True, cwd=compare.REPO, pass_fds=(lock,))
    runs = [subprocess.Popen(conversion_command(settings, "train", *options), cwd=compare.REPO, pass_fds=(lock,))
            for _, options in conversion_runs(settings, convert_run.saved_updates(settings.source))]
    return all(run.wait() == 0 for run in runs)


def conversion_rows(args):
    """recipes/convert/run.py's rows for the table, once every one of them has been evaluated
    (--report decodes nothing itself); none before."""
    settings = conversion_settings(args)
    if not os.path.isfile(settings.source):
        return ()
    updates = convert_run.saved_updates(settings.source)
    evaluations = ["source", "converted_0"] + [os.path.join(run, f"eval_{total}")
                                               for run, _ in conversion_runs(settings, updates)
                                               for total in convert_run.totals(updates, settings.fractions)]
    if not all(os.path.isfile(os.path.join(settings.out, folder, "score.json")) for folder in evaluations):
        return ()
    return convert_run.report_rows(settings, updates)


def reported_models(args):
    """Every model of the pair (and, for the LSTMs, every variant) whose log is under --out, whichever
    run trained it: a --models run beside the pair's adds its rows to the pair's table."""
    candidates = [*PAIRS[args.pair], *(converge_settings.LSTM_MODELS if args.pair == "lstm" else ())]
    return [m for m in dict.fromkeys(candidates) if os.path.isfile(log_path(args, m))]


def runs_so_far(args, references):
    """converged_table.read_run of each model with a log, stopped by patience or still running."""
    runs = {}
    for model in reported_models(args):
        runs[model] = converged_table.read_run(os.path.dirname(log_path(args, model)), references)
        curve = runs[model]["log"]["curve"]
        # with --jobs, one that has no epoch may be waiting for a free core
        runs[model]["log"]["stopped"] = "no epoch" if not curve else stop_reason(curve, args) or "running"
    return runs


def write_results(args, conversion_rows=()):
    references = converged_table.read_references(args.data)
    runs = runs_so_far(args, references)
    baseline, memory = PAIRS[args.pair][:2]
    # Each driver rewrites the table and the curves every round (a second one trains --models beside
    # the first): written whole, then renamed, so that a reader never meets half of either.
    replace_atomically(os.path.join(args.out, f"curves_{args.pair}_cpu.png"),
                       lambda path: plot_curves(path, f"Bible en-fr, CPU: {memory} against {baseline}",
                                                {m: run["log"]["curve"] for m, run in runs.items()}))
    rows, signatures = converged_table.pair_rows(runs, "CPU")
    # A median over the epochs: a run paused (SIGSTOP) while other work is timed would count its pause.
    minutes = {m: statistics.median(run["log"]["epoch_seconds"]) / 60 for m, run in runs.items()
               if run["log"]["epoch_seconds"]}
    models = ", ".join(m for m in runs if m != baseline)
    lines = [f"# Bible en-fr at convergence: {models} against {baseline}", "",
             "Trained side by side on a 2-core CPU, one thread each, from the same seed and data, each until "
             f"{args.patience} epochs without a better validation loss: {SETTINGS[args.pair]}. Test split "
             f"(Romans), beam 5, sacreBLEU on detokenised text. {converged_table.CHOSEN_CHECKPOINT} ms / token: "
             "the test split decoded "
             "with one thread, fairseq-generate's timer, per output token. Minutes per epoch (median, side by side): "
             + ", ".join(f"{m} {v:.1f}" for m, v in minutes.items()) + "."
             + (f" Options added: `{shlex.join(args.train_args)}`." if args.train_args else ""),
             "", "```bash", *driver_commands(args.pair, list(runs)), "```", "",
             *converged_table.TABLE_HEADER, *rows, "",
             "Signatures: " + "; ".join(f"`{s}`" for s in sorted(signatures)), "",
             f"Validation curves: [curves_{args.pair}_cpu.png](curves_{args.pair}_cpu.png); each run's log, "
             "command lines and hypotheses in [cpu/](cpu/).", ""]
    lines += converged_table.length_section(stage_dir(args), runs, args.data, references["test"])
    lines += converged_table.lstm_gap_section(stage_dir(args), runs, args.data, references["valid"])
    lines += converged_table.conversion_section(conversion_rows, args.convert_fractions, "by fairseq-validate")
    replace_atomically(os.path.join(args.out, "table.md"),
                       lambda path: pathlib.Path(path).write_text("\n".join(lines), encoding="utf-8"))


def hold_lock(work):
    """The driver's lock (held by its fairseq-train processes too), or None if another holds it."""
    os.makedirs(work, exist_ok=True)
    descriptor = os.open(os.path.join(work, "driver.lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    return descriptor


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Everything the driver reads of it, checked before hours of training find a part missing.
    p.add_argument("--data", required=True, type=prepared("data-bin", *lstm_gap.REFERENCES, *lstm_gap.SOURCES),
                   help="recipes.wmt17.run prepare's output folder (data-bin, ref, bpe)")
    p.add_argument("--pair", choices=sorted(PAIRS), default="transformer",
                   help="the models: " + "; ".join(f"{pair}: {' '.join(models)}" for pair, models in PAIRS.items())
                        + " (default transformer)")
    p.add_argument("--models", nargs="+", metavar="MODEL",
                   help="train (and report) these of the pair's models and variants (default: the pair's; "
                        "--pair lstm also takes "
                        + ", ".join(m for m in converge_settings.LSTM_MODELS if m not in PAIRS["lstm"]) + ")")
    p.add_argument("--work", type=output_dir,
                   help="checkpoints (default checkpoints/bible/converged, converged_lstm for --pair lstm)")
    p.add_argument("--out", type=output_dir,
                   help="logs, hypotheses, table and curves (default results/bible/converged, its cpu_lstm/ for "
                        "--pair lstm)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--patience", type=positive_int, default=converge_settings.PATIENCE,
                   help="epochs without a better validation loss that end a run "
                        f"(default {converge_settings.PATIENCE})")
    p.add_argument("--train-args", type=shlex.split, default=[],
                   help="more fairseq-train options, one string (they override the recipe's)")
    p.add_argument("--max-epoch", type=positive_int, default=sys.maxsize, help="a cap on epochs (default none)")
    p.add_argument("--convert-fractions", type=positive_number, nargs="+", default=converge_settings.CONVERT_FRACTIONS,
                   help="--pair transformer: fine-tune the converted transformer for these fractions of its updates "
                        f"(default {' '.join(map(str, converge_settings.CONVERT_FRACTIONS))})")
    p.add_argument("--jobs", type=positive_int,
                   help="models trained at once, one thread each (default: all of them); those furthest along "
                        "start first, the next as one stops (--pair lstm --jobs 2: a core each on two cores)")
    p.add_argument("--report", action="store_true",
                   help="only write the table and curves from the logs so far (also while a run goes on)")
    args = p.parse_args(argv)
    allowed = converge_settings.LSTM_MODELS if args.pair == "lstm" else PAIRS[args.pair]
    unknown = [m for m in args.models or () if m not in allowed]
    if unknown:
        p.error(f"argument --models: invalid choice for --pair {args.pair}: {', '.join(map(repr, unknown))} "
                f"(choose from {', '.join(allowed)})")
    refuse_duplicates(p, args, "models")
    args.models = args.models or list(PAIRS[args.pair])
    args.work = args.work or DEFAULT_WORK[args.pair]
    args.out = args.out or DEFAULT_OUT[args.pair]
    os.environ["OMP_NUM_THREADS"] = "1"  # fairseq-train, -generate and -validate on one thread each
    if args.report:
        if not reported_models(args):  # the models with a log
            p.error(f"--out {args.out}: no run's log under {stage_dir(args)} to report (--out is the folder "
                    "the driver wrote)")
        write_results(args, conversion_rows(args))
        return 0
    lock = hold_lock(args.work)
    if lock is None:
        converge.log(f"already running (the lock {os.path.join(args.work, 'driver.lock')} is held): nothing to do")
        return 0
    # Under the lock: a running driver's first epoch is logged before its checkpoint is saved.
    models = args.models
    for problem in filter(None, (orphaned_log(args, model) for model in models)):
        p.error(problem)
    written = threading.Lock()

    def on_round():
        with written:
            write_results(args)

    threads = {}
    outcome = {}
    slots = threading.Semaphore(args.jobs or len(models))

    def run(model):
        try:
            outcome[model] = train_and_decode(args, model, lock, on_round)
        finally:
            slots.release()

    for model in sorted(models, key=lambda m: -epochs_validated(args, m)):  # stable: --models' order among equals
        slots.acquire()
        threads[model] = threading.Thread(target=run, args=(model,))
        threads[model].start()
    for thread in threads.values():
        thread.join()
    if not all(outcome.get(model) for model in models):  # a failure, or an exception in a thread
        return 1
    converge.log("all stopped: test from the best checkpoints, one at a time")
    for model in models:
        decode_test_alone(args, model)
    write_results(args)
    if "transformer" not in models:
        converge.log(f"done: {os.path.join(args.out, 'table.md')}")
        return 0
    converge.log("converting the transformer and fine-tuning")
    if not convert(args, lock):
        return 1
    settings = conversion_settings(args)
    write_results(args, convert_run.report_rows(settings, convert_run.saved_updates(settings.source)))
    converge.log(f"done: {os.path.join(args.out, 'table.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
