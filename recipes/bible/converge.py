#!/usr/bin/env python
"""Quality at convergence on one GPU: both pairs of compare.py (fairseq's ``transformer`` against
``transformer_memattn``, ``lstm_att`` against ``lstm_memattn``) trained side by side on the Bible en-fr
data until validation loss stops improving, then decoded; one command that fits one 10-minute run on a
GPU machine without network.

    python -m recipes.bible.converge pack --data DATA          # here: .gpu/ = data-bin, references, wheels
    bash recipes/bible/converge_gpu.sh --out "$OUT"            # there: installs .gpu/wheels, then `run`
    python -m recipes.bible.converge report OUT/converged.tar.gz --data DATA   # here: results/bible/converged/

``run`` first trains every model for a few updates (a broken environment fails in a minute), then
trains the four concurrently with --patience on validation loss and a wall-clock cap
(--stop-time-hours) that leaves time to decode; runs the CUDA-only tests meanwhile (unless
--no-cuda-tests); decodes valid and test with beam 5 from the best checkpoint and from the average
of the last epochs' checkpoints; and times the test decoding of each best checkpoint alone. What
comes back is one archive: each run's command, train.log and hypotheses, the tests' summary and the
machine. Checkpoints stay in --work.
``report`` scores the archive here (sacreBLEU BLEU and chrF), takes the averaged checkpoint for a
pair only where it beats the best one on validation for both models, and writes table.md and one
curve plot per pair. Its --out is a new or empty folder, or an earlier report's (it holds the
archive's machine.txt): there the files of the earlier run and report are replaced, and anything
else (a README.md) is kept.
"""

import argparse
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from fairseq_memattn.arg_types import non_negative_int, positive_int, positive_number
from fairseq_memattn.staging import replace_atomically
from recipes.bible import compare, lstm_gap
from recipes.bible.converge_settings import (AVERAGE_LAST, CONVERT_FRACTIONS, CONVERT_RUNS, GPU_BATCH,
                                             LSTM_MODELS, MODELS, PAIRS, PATIENCE, PLOTTED_EXAMPLE, VARIANTS)
from recipes.bible.converged_table import BEST_RECORD, MARKER, archive_names, replaced, report
from recipes.bible.options import prepared
from recipes.cli import check, existing_file, folder_with, output_dir, refuse_duplicates
from recipes.convert import run as convert_run
from recipes.train_log import finished

# The variants put forward as lstm_memattn's fix on validation evidence (docs/wmt17.md): decoded on
# test like the pairs, for the comparison with lstm_att at convergence.
FIXES = ("lstm_memattn_position_mean", "lstm_memattn_attention_read", "lstm_memattn_general_read")
PAIR_MODELS = [model for pair in PAIRS.items() for model in pair]  # what run trains by default
STATISTICS_LOCK = threading.Lock()
TIMED_SECONDS = 60  # kept after the decoding and the conversion for the test split decoded alone
ARCHIVE = "converged.tar.gz"


def log(message):
    print(time.strftime("%H:%M:%S"), message, flush=True)


def train_command(model, data_bin, save_dir, seed, options):
    """fairseq-train of MODEL on the Bible en-fr data, with the options of the device and the run."""
    return [sys.executable, "-m", "fairseq_cli.train", data_bin, "--user-dir", compare.PLUGIN,
            "--task", "translation", "--source-lang", "en", "--target-lang", "fr", *MODELS[model],
            "--seed", str(seed), "--max-source-positions", "256", "--max-target-positions", "256",
            "--skip-invalid-size-inputs-valid-test", "--required-batch-size-multiple", "1",
            "--save-dir", save_dir, "--log-format", "simple", "--log-interval", "50", *options]


def gpu_train_command(model, args, save_dir, extra):
    return train_command(model, os.path.join(args.bundle, "data-bin"), save_dir, args.seed,
                         [*GPU_BATCH[model], "--num-workers", "2", *device_args(args),
                          *shlex.split(args.train_args), *extra])


def device(args):
    return "cpu" if args.cpu else args.precision


def device_args(args):
    return compare.device_flags(device(args))


def start(command, log_path):
    """COMMAND in its own process group (so that a kill takes its children too), output to LOG_PATH."""
    with open(log_path, "a", encoding="utf-8") as f:  # the child keeps its own copy of the descriptor
        f.write("$ " + shlex.join(command) + "\n")
        f.flush()
        return subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT, cwd=compare.REPO,
                                start_new_session=True)


def wait_all(processes, seconds):
    """Return codes of {name: Popen}; whatever is still running after SECONDS is killed with its
    process group (code None)."""
    end = time.monotonic() + seconds
    codes = {}
    for name, process in processes.items():
        try:
            codes[name] = process.wait(timeout=max(1.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            codes[name] = None
    return codes


def trained(code, log_path):
    """Whether a fairseq-train run finished: exit 0, or "done training" logged before a failed exit
    (fairseq-train now and then aborts in its teardown, "terminate called without an active
    exception", after its checkpoints are written)."""
    with open(log_path, encoding="utf-8") as f:
        return finished(code, f.read())


def smoke(args, stage, work):
    """A few updates of every model at once: a broken environment fails here, in about a minute."""
    processes = {}
    for model in args.models:
        os.makedirs(os.path.join(stage, model), exist_ok=True)
        command = gpu_train_command(model, args, os.path.join(work, "smoke", model),
                                ["--max-update", str(args.smoke_updates), "--disable-validation",
                                 "--no-save"])
        processes[model] = start(command, os.path.join(stage, model, "smoke.log"))
    codes = wait_all(processes, 240)
    failed = {m: c for m, c in codes.items() if not trained(c, os.path.join(stage, m, "smoke.log"))}
    for model, code in failed.items():
        log(f"{model}: smoke training failed (exit {code}); the end of its log:")
        with open(os.path.join(stage, model, "smoke.log"), encoding="utf-8") as f:
            print("".join(f.readlines()[-25:]), flush=True)
    return not failed


def train(args, stage, work, seconds):
    """The four models side by side, each to --patience or the wall-clock cap."""
    processes = {}
    for model in args.models:
        command = gpu_train_command(model, args, os.path.join(work, "checkpoints", model),
                                ["--patience", str(PATIENCE), "--stop-time-hours", f"{seconds / 3600:.5f}",
                                 "--keep-last-epochs", str(AVERAGE_LAST), "--no-last-checkpoints",
                                 "--max-update", str(args.max_update)])
        with open(os.path.join(stage, model, "command.txt"), "w", encoding="utf-8") as f:
            f.write(shlex.join(command) + "\n")
        processes[model] = start(command, os.path.join(stage, model, "train.log"))
    # --stop-time-hours counts from the trainer's start and is checked after each update; a final
    # validation and save follow, hence the grace before a run is killed.
    return wait_all(processes, seconds + 120)


def average_checkpoints(paths, out):
    """fairseq's scripts/average_checkpoints.py (not in its wheel): the mean of each parameter."""
    import torch

    # Our own files, written minutes ago by fairseq-train on this machine.
    states = [torch.load(p, map_location="cpu", weights_only=False) for p in paths]
    averaged = states[-1]
    averaged["model"] = {name: sum(s["model"][name].double() for s in states).div(len(states))
                         .to(tensor.dtype) for name, tensor in averaged["model"].items()}
    averaged.pop("last_optimizer_state", None)
    torch.save(averaged, out)


def epoch_checkpoints(folder):
    found = [(int(m.group(1)), name) for name in os.listdir(folder)
             for m in [re.fullmatch(r"checkpoint(\d+)\.pt", name)] if m]
    return [os.path.join(folder, name) for _, name in sorted(found)]


def evaluate(args, checkpoint, subset, out):
    """CHECKPOINT decoded on SUBSET into OUT; None where args.deadline (time.monotonic(), or None)
    comes first, so that the archive is still written in time."""
    from recipes.wmt17 import run as wmt17_run

    # wmt17_run's beam 10 and batches of 64 overridden; --fp16 on a GPU, --cpu otherwise.
    generate = ["--beam", "5", "--batch-size", "128", *shlex.split(args.generate_args)]
    left = None if args.deadline is None else args.deadline - time.monotonic()
    if left is not None and left < 5:
        log(f"no time left to decode {checkpoint} on {subset}")
        return None
    try:
        result = wmt17_run.evaluate("en-fr", checkpoint, args.bundle, subset, out, 0 if args.cpu else 1, 1,
                                    generate, timeout=left)
    except TimeoutError as e:
        log(str(e))
        return None
    with open(os.path.join(out, f"evaluate.{subset}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)
    return result


def tested(model):
    """Whether MODEL is decoded on test: the pairs' models and FIXES (the other variants: valid only)."""
    return model not in VARIANTS or model in FIXES


def decode(args, stage, work, model):
    """Valid and test from the averaged checkpoint and valid from the best one (models side by
    side); test from the best one comes later, alone, for its time. Not ``tested``: valid only."""
    folder = os.path.join(work, "checkpoints", model)
    best = os.path.join(folder, "checkpoint_best.pt")
    if not os.path.isfile(best):
        log(f"{model}: no checkpoint_best.pt, nothing to decode")
        return
    os.makedirs(os.path.join(stage, model, "best"), exist_ok=True)
    # fairseq keeps a tie as the best, so the log's first epoch at the lowest (rounded) loss may not be it.
    # Written whole at once: another thread's report may read it meanwhile.
    record = json.dumps({"updates": convert_run.saved_updates(best)})
    replace_atomically(os.path.join(stage, model, "best", BEST_RECORD),
                       lambda path: pathlib.Path(path).write_text(record, encoding="utf-8"))
    evaluate(args, best, "valid", os.path.join(stage, model, "best"))
    last = epoch_checkpoints(folder)[-AVERAGE_LAST:]
    if len(last) > 1:
        averaged = os.path.join(folder, "checkpoint_average.pt")
        average_checkpoints(last, averaged)
        out = os.path.join(stage, model, "average")
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "averaged.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(os.path.basename(p) for p in last) + "\n")
        for subset in ("valid", "test") if tested(model) else ("valid",):
            evaluate(args, averaged, subset, out)


def diagnose(args, stage, work, model):
    """A memory LSTM's best checkpoint: lstm_gap.read_statistics on valid, and its attention on
    validation example PLOTTED_EXAMPLE drawn (fairseq-memattn-plot)."""
    best = os.path.join(work, "checkpoints", model, "checkpoint_best.pt")
    if not os.path.isfile(best):
        return
    data_bin = os.path.join(args.bundle, "data-bin")
    plot = start([sys.executable, "-m", "fairseq_memattn.cli.plot", data_bin, "--user-dir", compare.PLUGIN,
                  "--task", "translation", "--source-lang", "en", "--target-lang", "fr", "--path", best,
                  "--gen-subset", "valid", "--example-id", str(PLOTTED_EXAMPLE), "--beam", "5",
                  "--post-process", "sentencepiece", *(["--cpu"] if args.cpu else []),
                  "--output", os.path.join(stage, model, f"attention_valid{PLOTTED_EXAMPLE}.png")],
                 os.path.join(stage, model, "plot.log"))
    if "memattn" in model:
        with STATISTICS_LOCK:  # one model loaded at a time in this process
            statistics = lstm_gap.read_statistics(best, data_bin)
        with open(os.path.join(stage, model, "read_statistics.json"), "w", encoding="utf-8") as f:
            json.dump(statistics, f)
    wait_all({"plot": plot}, 120)


def cuda_tests(stage):
    import torch

    if not torch.cuda.is_available():
        return None
    return start([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", "cuda",
                  os.path.join(compare.REPO, "tests")], os.path.join(stage, "cuda_tests.log"))


def describe_machine(stage):
    import fairseq
    import torch

    import fairseq_memattn

    lines = [f"python {sys.version.split()[0]}", f"torch {torch.__version__}",
             f"fairseq {fairseq.__version__}", f"fairseq_memattn {fairseq_memattn.__version__}"]
    if torch.cuda.is_available():
        lines.append(f"gpu {torch.cuda.get_device_name(0)}")
    with open(os.path.join(stage, MARKER), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    log(", ".join(lines))


def convert(args, stage, work, deadline):
    """recipes/convert on the converged transformer: its best checkpoint converted to
    transformer_memattn (K = 64, the position window) and fine-tuned for CONVERT_FRACTIONS of its
    updates beside the transformer continued as long, then the converted model and each fine-tuned
    checkpoint decoded on test. What still runs at DEADLINE (time.monotonic()) is killed."""
    source = os.path.join(work, "checkpoints", "transformer", "checkpoint_best.pt")
    if "transformer" not in args.models:
        return
    if not os.path.isfile(source):
        log("transformer: no checkpoint_best.pt, nothing to convert")
        return
    out, folder = os.path.join(stage, "convert"), os.path.join(work, "convert")
    os.makedirs(out, exist_ok=True)
    updates = convert_run.saved_updates(source)
    with open(os.path.join(out, "source.json"), "w", encoding="utf-8") as f:
        json.dump({"updates": updates, "fractions": CONVERT_FRACTIONS}, f)
    step = [sys.executable, "-m", "recipes.convert.run"]
    options = ["--data", args.bundle, "--source", source, "--work", folder, "--out", out,
               "--fractions", *map(str, CONVERT_FRACTIONS), "--device", device(args),
               *GPU_BATCH["transformer"], *shlex.split(args.train_args)]
    converted = wait_all({"convert": start([*step, "convert", *options], os.path.join(out, "convert.log"))},
                         deadline - time.monotonic())
    if converted["convert"] != 0:
        log(f"conversion failed (exit {converted['convert']}): see convert/convert.log")
        return
    codes = wait_all({run: start([*step, "train", run, *options], os.path.join(out, f"{run}.log"))
                      for run in CONVERT_RUNS}, deadline - time.monotonic())
    log(f"fine-tuning exit codes: {codes}")
    checkpoints = {"converted_0": os.path.join(folder, "converted.pt")}
    for run in CONVERT_RUNS:
        for total in convert_run.totals(updates, CONVERT_FRACTIONS):
            checkpoints[f"{run}_{total}"] = os.path.join(folder, run, convert_run.RUN_MODELS[run],
                                                         f"checkpoint_{total}.pt")

    def decode_test(name):
        if os.path.isfile(checkpoints[name]) and deadline - time.monotonic() > 30:
            os.makedirs(os.path.join(out, name), exist_ok=True)
            evaluate(args, checkpoints[name], "test", os.path.join(out, name))

    with ThreadPoolExecutor(len(checkpoints)) as pool:
        list(pool.map(decode_test, checkpoints))


def run(args):
    begun = time.monotonic()
    deadline = args.deadline = begun + args.minutes * 60 - 30  # the archive is written in the last 30 s
    if args.work is None:
        args.work = tempfile.mkdtemp(prefix="converge-")
    stage = os.path.join(args.work, "converged")
    os.makedirs(stage)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(stage, "command.txt"), "w", encoding="utf-8") as f:
        f.write(shlex.join(["python", "-m", "recipes.bible.converge", *args.argv]) + "\n")
    try:
        describe_machine(stage)
        log(f"smoke: {args.smoke_updates} updates per model")
        if not smoke(args, stage, args.work):
            return 1
        tests = None if args.no_cuda_tests else cuda_tests(stage)
        seconds = args.minutes * 60 - (time.monotonic() - begun) - args.decode_minutes * 60
        if seconds < 60:
            log(f"only {seconds:.0f} s left for training: raise --minutes or lower --decode-minutes")
            return 1
        log(f"training {', '.join(args.models)} side by side, at most {seconds:.0f} s each")
        codes = train(args, stage, args.work, seconds)
        log(f"training exit codes: {codes}")
        with ThreadPoolExecutor(len(args.models) + 1) as pool:
            # The conversion beside the decoding; the timed decoding below needs the machine alone.
            conversion = pool.submit(convert, args, stage, args.work, deadline - TIMED_SECONDS)
            list(pool.map(lambda m: decode(args, stage, args.work, m), args.models))
            conversion.result()
            list(pool.map(lambda m: diagnose(args, stage, args.work, m), [m for m in args.models if m in LSTM_MODELS]))
        for model in filter(tested, args.models):  # alone on the machine, for the decoding time
            best = os.path.join(args.work, "checkpoints", model, "checkpoint_best.pt")
            result = evaluate(args, best, "test", os.path.join(stage, model, "best")) if os.path.isfile(best) else None
            if result:
                log(f"{model}: test BLEU {result['bleu']} in {result['decoding_seconds']} s")
        if tests is not None:
            code = wait_all({"tests": tests}, max(1.0, deadline - time.monotonic()))
            log(f"CUDA tests exit code {code['tests']}")
        return 0 if all(trained(c, os.path.join(stage, m, "train.log")) for m, c in codes.items()) else 1
    finally:
        with tarfile.open(os.path.join(args.out, ARCHIVE), "w:gz") as tar:
            tar.add(stage, arcname="converged")
        log(f"wrote {os.path.join(args.out, ARCHIVE)} after {time.monotonic() - begun:.0f} s")


def pack(args):
    """The data (binarized, references, sentencepiece model) and the wheels the GPU machine lacks."""
    for part in ("data-bin", "ref"):
        shutil.rmtree(os.path.join(args.bundle, part), ignore_errors=True)
        shutil.copytree(os.path.join(args.data, part), os.path.join(args.bundle, part))
    shutil.copy(os.path.join(args.data, "spm.model"), args.bundle)
    if args.no_wheels:
        return
    wheels = os.path.join(args.bundle, "wheels")
    os.makedirs(wheels, exist_ok=True)
    platforms = [f"--platform={p}_x86_64" for p in
                 ("manylinux_2_28", "manylinux_2_17", "manylinux2014", "manylinux1")]
    for spec in WHEELS:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", wheels,
                        spec], check=True)
    # antlr4-python3-runtime 4.9.3 (what omegaconf 2.3 needs) is published as source only: a pure wheel.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels,
                    "antlr4-python3-runtime==4.9.3"], check=True)


# What fairseq needs beyond the GPU machine's image (torch 2.11, Python 3.12; its package list is in
# the device tool's KINDS.md).
WHEELS = ["ve-fairseq==0.12.3", "hydra-core==1.3.8", "omegaconf==2.3.1", "bitarray==3.12.3", "cffi==2.1.1",
          "pycparser==3.12", "sacremoses==0.2.0"]


def parse(argv=None):
    """The command line, checked: a bad value ends in argparse's one line before anything runs."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    default_bundle = os.path.join(compare.REPO, ".gpu")
    bundled = ("data-bin", *lstm_gap.REFERENCES)  # what run reads of the bundle
    pk = sub.add_parser("pack", help="here: data and wheels into the bundle folder")
    pk.add_argument("--data", required=True, type=prepared(*bundled, "spm.model"),
                    help="recipes.wmt17.run prepare's output folder (data-bin, ref, spm.model)")
    pk.add_argument("--bundle", default=default_bundle, type=output_dir, help="default .gpu/ (ignored by git)")
    pk.add_argument("--no-wheels", action="store_true", help="the data only")
    r = sub.add_parser("run", help="there: smoke, train, decode, archive")
    r.add_argument("--bundle", default=default_bundle, type=folder_with(*bundled),
                   help="what pack wrote (default .gpu/)")
    r.add_argument("--out", required=True, type=output_dir, help=f"where {ARCHIVE} goes")
    r.add_argument("--work", type=output_dir, help="checkpoints and the archive's staging: an empty or new folder "
                                                   "(default a new temporary one)")
    r.add_argument("--minutes", type=positive_number, default=8.0, help="the whole command's wall clock (default 8)")
    r.add_argument("--decode-minutes", type=positive_number, default=2.5,
                   help="kept for decoding after training (default 2.5)")
    r.add_argument("--precision", choices=[d for d in compare.DEVICES if d != "cpu"], default="fp16",
                   help="fairseq-train's --fp16, --bf16 or --amp (default fp16)")
    r.add_argument("--cpu", action="store_true", help="no GPU (the driver's own test)")
    r.add_argument("--models", nargs="+", choices=list(MODELS), default=PAIR_MODELS,
                   help="the models to train (default the two pairs; VARIANTS on demand)")
    r.add_argument("--no-cuda-tests", action="store_true",
                   help="skip the CUDA-only tests that otherwise run beside the training")
    r.add_argument("--smoke-updates", type=positive_int, default=5)
    r.add_argument("--max-update", type=non_negative_int, default=0, help="a cap on updates (default 0: none)")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--train-args", default="", help="more fairseq-train options, one string")
    r.add_argument("--generate-args", default="", help="more fairseq-generate options, one string")
    r.add_argument("--check", action="store_true",
                   help="only check the options and print --out (converge_gpu.sh, before it installs anything)")
    rp = sub.add_parser("report", help="here: score the archive, table and curves")
    rp.add_argument("archive", type=existing_file)
    rp.add_argument("--data", required=True, type=prepared(*lstm_gap.REFERENCES, *lstm_gap.SOURCES),
                    help="the folder pack read (for the references and the sources' lengths)")
    rp.add_argument("--out", type=output_dir,
                    default=os.path.join(compare.REPO, "results", "bible", "converged", "gpu"),
                    help="new, empty, or an earlier report's folder, whose files from run and report are replaced "
                         "(others, a README.md say, are kept); default results/bible/converged/gpu")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if args.command == "pack" and os.path.realpath(args.bundle) == os.path.realpath(args.data):
        pk.error(f"argument --bundle: {args.bundle}: the --data folder itself (pack replaces its data-bin and ref)")
    if args.command == "run":
        if args.work is not None and os.path.isdir(args.work) and os.listdir(args.work):
            r.error(f"argument --work: {args.work}: not empty (fairseq-train would resume an earlier run's "
                    "checkpoints)")
        left = args.minutes - args.decode_minutes
        if left < 2:
            r.error(f"argument --minutes: {args.minutes:g} minus --decode-minutes {args.decode_minutes:g} leaves "
                    f"{left:g} minutes for the smoke step and training, at least 2 needed (raise --minutes or "
                    "lower --decode-minutes)")
        refuse_duplicates(r, args, "models")
    if args.command == "report":
        incoming = check(rp, "archive", archive_names, args.archive)
        args.replaced = check(rp, "--out", lambda out: replaced(out, incoming), args.out)
    return args


def main(argv=None):
    args = parse(argv)
    if args.command == "run" and args.check:
        print(args.out)
        return 0
    if args.command == "pack":
        return pack(args)
    if args.command == "run":
        return run(args)
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
