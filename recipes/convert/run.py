#!/usr/bin/env python
"""A trained fairseq transformer converted to transformer_memattn on the Bible en-fr corpus
(recipes/bible/compare.py's models and data), against continuing the transformer and against
transformer_memattn from scratch, at the same update totals. N is the transformer's update count;
the totals are N + 2 %, 5 %, 10 %, 25 % of N (--fractions).

    python -m recipes.convert.run convert --data DATA --source CHECKPOINTS/transformer/checkpoint_last.pt
    OMP_NUM_THREADS=1 python -m recipes.convert.run train converted --data DATA   # fine-tune, all parameters
    OMP_NUM_THREADS=1 python -m recipes.convert.run train converted --data DATA --write-only-updates U
    OMP_NUM_THREADS=1 python -m recipes.convert.run train original --data DATA    # the transformer, continued
    OMP_NUM_THREADS=1 python -m recipes.convert.run train scratch --data DATA     # transformer_memattn, window
    python -m recipes.convert.run report --data DATA                              # OUT/table.md

``train`` runs fairseq-train to each total in turn (one thread), resuming from the run's
checkpoint_last.pt, and keeps checkpoint_TOTAL.pt; the converted and original runs start from the
converted checkpoint and from a copy of the transformer's checkpoint_last.pt, so both keep its
update count, learning-rate schedule, optimizer moments and data position. ``--write-only-updates
U`` first trains only the write for U updates (the other parameters frozen, each total on the way
kept too), then everything.
``report`` evaluates every checkpoint (test sacreBLEU and chrF with beam 5 via ``recipes.wmt17.run
evaluate``, validation loss via fairseq-validate, decoding seconds) and times the original and the
converted model on sources of --long-length tokens. Re-running any step skips what is done; a
--work whose converted.pt is not the conversion of --source with these options is refused.
Options this driver does not know go to fairseq-train (after compare.py's, so they override them);
every step takes them, so that one command line serves all, and the conversion takes their
--memory-* ones. An option fairseq-train would refuse is refused before any work.
"""

import argparse
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PLUGIN = os.path.join(REPO, "fairseq_memattn")
from fairseq_memattn.arg_types import integer_at_least, non_negative_int, positive_number
from recipes import cli
from recipes.bible import compare
from recipes.cli import check, existing_file, folder_with, output_dir
from recipes.wmt17.run import fairseq_tool, fairseq_train_options

FRACTIONS = (0.02, 0.05, 0.1, 0.25)
ORIGINAL, MEMORY = "transformer", "transformer_memattn_window"  # compare.MODELS: the source, the target
RUN_MODELS = {"converted": MEMORY, "original": ORIGINAL, "scratch": MEMORY}
LONG_LENGTH = 800


# memory attention's options (not fairseq's --memory-efficient-fp16 and -bf16)
MEMORY_OPTION = re.compile(r"--(no-)?memory-(?!efficient-)[a-z-]+")


def memory_flags(flags):
    """The memory attention options (with their values) of a fairseq-train command line."""
    picked = []
    for index, flag in enumerate(flags):
        if MEMORY_OPTION.fullmatch(flag):
            value = flags[index + 1] if index + 1 < len(flags) and not flags[index + 1].startswith("--") else None
            picked += [flag] + ([value] if value is not None else [])
    return picked


def load(checkpoint):
    """A fairseq checkpoint's state, on the CPU, read once while the file stays as it is (a command
    asks the source for its updates and its weights; callers only read it)."""
    saved = os.stat(checkpoint)
    return _load(checkpoint, saved.st_mtime_ns, saved.st_size)


@functools.lru_cache(maxsize=2)
def _load(checkpoint, mtime_ns, size):
    import fairseq_memattn

    fairseq_memattn.register()  # torch.load's allowlist for fairseq checkpoints
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(checkpoint)


def saved_updates(checkpoint):
    """The update count a checkpoint was saved at (the source's: N)."""
    return load(checkpoint)["optimizer_history"][-1]["num_updates"]


def totals(updates, fractions):
    return [updates + max(1, round(f * updates)) for f in fractions]


def converted_path(args):
    return os.path.join(args.work, "converted.pt")


def conversion_changed(args, planned):
    """Why WORK/converted.pt is not the conversion of --source with PLANNED's memory options (the
    memory model's fairseq-train options), or None. The conversion keeps every weight of its
    source, and its checkpoint holds the options it was made with."""
    import torch

    from fairseq_memattn.convert import as_namespace

    source, converted = load(args.source)["model"], load(converted_path(args))
    kept = [key for key in source if key in converted["model"] and source[key].shape == converted["model"][key].shape]
    if not kept or not all(torch.equal(source[key], converted["model"][key]) for key in kept):
        return f"made from another checkpoint than --source {args.source}"
    made = {key: value for key, value in vars(as_namespace(converted["cfg"]["model"])).items()
            if MEMORY_OPTION.fullmatch("--" + key.replace("_", "-"))}
    differs = cli.changed(made, vars(planned))
    return f"made with {differs}" if differs else None


def convert(args):
    if os.path.isfile(converted_path(args)):
        print(f"{converted_path(args)}: converted already", flush=True)
        return
    command = [sys.executable, "-m", "fairseq_memattn.cli.convert", args.source, converted_path(args),
               "--data", os.path.join(args.data, "data-bin"), *memory_flags([*compare.MODELS[MEMORY], *args.extra])]
    print("$ " + shlex.join(command), flush=True)
    # fairseq-memattn-convert explains a refusal in its own line; its status is the recipe's
    status = subprocess.run(command, cwd=REPO).returncode
    if status:
        sys.exit(status)


def run_name(run, write_only_updates=0):
    """The run's folder name: converted_writeU for the converted model with the write alone first."""
    return f"converted_write{write_only_updates}" if run == "converted" and write_only_updates else run


def checkpoint_folder(args, run):
    return os.path.join(args.work, run, RUN_MODELS[run.split("_")[0]])


def seed_checkpoint(args):
    """What the run starts from: None (scratch), the converted model or the transformer."""
    return {"converted": converted_path(args), "original": args.source, "scratch": None}[args.run]


def stages(args, updates):
    """(total, write only) for each fairseq-train run, in order: the write alone up to N + U
    (stopping at each total on the way), then everything."""
    write_only_to = updates + args.write_only_updates
    planned = sorted({*totals(updates, args.fractions), *([write_only_to] if args.write_only_updates else [])})
    return [(total, total <= write_only_to) for total in planned]


def train(args):
    updates = saved_updates(args.source)
    run = run_name(args.run, args.write_only_updates)
    folder = checkpoint_folder(args, run)
    seed = seed_checkpoint(args)
    if seed is not None and not os.path.isfile(os.path.join(folder, "checkpoint_last.pt")):
        if not os.path.isfile(seed):
            sys.exit(f"{seed} does not exist: run the convert step first")
        os.makedirs(folder, exist_ok=True)
        shutil.copyfile(seed, os.path.join(folder, "checkpoint_last.pt"))
    for total, write_only in stages(args, updates):
        snapshot = os.path.join(folder, f"checkpoint_{total}.pt")
        if os.path.isfile(snapshot):
            continue
        extra = [*args.extra, "--memory-train-write-only"] if write_only else args.extra
        stage = argparse.Namespace(out=os.path.join(args.out, run), checkpoints=os.path.join(args.work, run),
                                   model=RUN_MODELS[args.run], data=args.data, max_update=total,
                                   seed=args.seed, device=args.device, extra=extra)
        if compare.train(stage) != 0:
            sys.exit(f"fairseq-train of {run} to {total} updates failed: see {stage.out}/{stage.model}/train.log")
        shutil.copyfile(os.path.join(folder, "checkpoint_last.pt"), snapshot)


def chrf(hypotheses_file, references_file):
    import sacrebleu

    with open(hypotheses_file, encoding="utf-8") as h, open(references_file, encoding="utf-8") as r:
        return round(sacrebleu.corpus_chrf([line.rstrip("\n") for line in h],
                                           [[line.rstrip("\n") for line in r]]).score, 2)


def validation_loss(checkpoint, data):
    """(loss, nll_loss) of fairseq-validate on the valid split, with the checkpoint's criterion."""
    result = subprocess.run(
        [fairseq_tool("fairseq-validate"), os.path.join(data, "data-bin"), "--user-dir", PLUGIN,
         "--task", "translation", "--source-lang", "en", "--target-lang", "fr", "--path", checkpoint,
         "--valid-subset", "valid", "--max-tokens", "4096", "--cpu", "--skip-invalid-size-inputs-valid-test"],
        capture_output=True, text=True, cwd=REPO)
    found = re.search(r"valid on 'valid' subset \| loss ([\d.]+) \| nll_loss ([\d.]+)", result.stderr + result.stdout)
    if result.returncode != 0 or not found:
        sys.exit(f"fairseq-validate of {checkpoint} failed:\n{result.stderr[-2000:]}")
    return float(found.group(1)), float(found.group(2))


def evaluate(checkpoint, data, out):
    """Test BLEU, chrF and decoding seconds, validation loss: OUT/score.json, made once."""
    score_file = os.path.join(out, "score.json")
    if not os.path.isfile(score_file):
        os.makedirs(out, exist_ok=True)
        score = compare.decode_test(checkpoint, data, out)
        score["chrf"] = chrf(os.path.join(out, "hyp.test.fr"), os.path.join(data, "ref", "test.fr"))
        score["valid_loss"], score["valid_nll_loss"] = validation_loss(checkpoint, data)
        with open(score_file, "w", encoding="utf-8") as f:
            json.dump(score, f)
    with open(score_file, encoding="utf-8") as f:
        return json.load(f)


def long_sources(data, folder, length):
    """FOLDER laid out as prepare's DATA: the test split's BPE lines joined into sources of exactly
    ``length`` tokens with EOS (and targets of as many), binarized with DATA's dictionaries."""
    if os.path.isfile(os.path.join(folder, "data-bin", "test.en-fr.en.bin")):
        return folder
    streams = {}
    for lang in ("en", "fr"):
        with open(os.path.join(data, "bpe", f"test.{lang}"), encoding="utf-8") as f:
            streams[lang] = " ".join(line.strip() for line in f).split()
    count = len(streams["en"]) // (length - 1)
    if count == 0:
        sys.exit(f"the test split has fewer than {length - 1} BPE tokens: pass a smaller --long-length")
    os.makedirs(os.path.join(folder, "bpe"), exist_ok=True)
    os.makedirs(os.path.join(folder, "ref"), exist_ok=True)
    for lang in ("en", "fr"):
        pieces = [streams[lang][i * (length - 1):(i + 1) * (length - 1)] for i in range(count)]
        with open(os.path.join(folder, "bpe", f"test.{lang}"), "w", encoding="utf-8") as f:
            f.writelines(" ".join(piece) + "\n" for piece in pieces)
    shutil.copyfile(os.path.join(folder, "bpe", "test.fr"), os.path.join(folder, "ref", "test.fr"))
    binarize(data, os.path.join(folder, "bpe"), "test", folder)
    return folder


def binarize(data, text, split, folder):
    """TEXT/SPLIT.{en,fr} binarized into FOLDER/data-bin with DATA's dictionaries."""
    binarized = os.path.join(data, "data-bin")
    subprocess.run([fairseq_tool("fairseq-preprocess"), "--source-lang", "en", "--target-lang", "fr",
                    f"--{split}pref", os.path.join(text, split), "--destdir", os.path.join(folder, "data-bin"),
                    "--srcdict", os.path.join(binarized, "dict.en.txt"),
                    "--tgtdict", os.path.join(binarized, "dict.fr.txt"), "--workers", "1"],
                   check=True, capture_output=True)


def time_long(checkpoint, long_data, out, length):
    """Decoding seconds and output tokens (beam 5) on the long sources: OUT/score.json, made once."""
    score_file = os.path.join(out, "score.json")
    if not os.path.isfile(score_file):
        os.makedirs(out, exist_ok=True)
        positions = str(length + 2)
        score = compare.decode_test(checkpoint, long_data, out, [
            "--max-source-positions", positions, "--max-target-positions", positions,
            "--model-overrides", repr({"max_source_positions": length + 2, "max_target_positions": length + 2})])
        with open(score_file, "w", encoding="utf-8") as f:
            json.dump(score, f)
    with open(score_file, encoding="utf-8") as f:
        return json.load(f)


def report_rows(args, updates):
    """(label, updates, fine-tuning updates, score) for every checkpoint that exists."""
    rows = [("transformer (the source)", updates, 0, evaluate(args.source, args.data, os.path.join(args.out, "source"))),
            ("converted, before fine-tuning", updates, 0,
             evaluate(converted_path(args), args.data, os.path.join(args.out, "converted_0")))]
    runs = sorted(name for name in os.listdir(args.work) if os.path.isdir(os.path.join(args.work, name))
                  and name.split("_")[0] in RUN_MODELS)
    for total in totals(updates, args.fractions):
        for run in runs:
            checkpoint = os.path.join(checkpoint_folder(args, run), f"checkpoint_{total}.pt")
            if os.path.isfile(checkpoint):
                score = evaluate(checkpoint, args.data, os.path.join(args.out, run, f"eval_{total}"))
                rows.append((run, total, total - updates if run != "scratch" else total, score))
    return rows


def report(args):
    updates = saved_updates(args.source)
    # before any evaluation: the test split may be too short for --long-length
    long_data = long_sources(args.data, os.path.join(args.work, f"long{args.long_length}"), args.long_length)
    os.makedirs(args.out, exist_ok=True)
    rows = report_rows(args, updates)
    long_rows = [(label, time_long(checkpoint, long_data, os.path.join(args.out, f"long_{name}"), args.long_length))
                 for label, name, checkpoint in (("transformer (the source)", "source", args.source),
                                                 ("converted", "converted", converted_path(args)))]
    write_table(args, updates, rows, long_rows)


def write_table(args, updates, rows, long_rows):
    lines = [f"# Bible en-fr: a transformer trained for N = {updates} updates, converted to transformer_memattn",
             "", "Test split (Romans), beam 5, sacreBLEU and chrF on detokenised text (`recipes.wmt17.run evaluate`); "
             "validation loss (label-smoothed, as in training) by fairseq-validate; decoding seconds by "
             "fairseq-generate's timer, one thread. `original`: the transformer continued from its "
             "checkpoint_last.pt; `converted*`: fine-tuned from the conversion (all parameters, or the write "
             f"alone for its first U updates in `converted_writeU`); `scratch`: {MEMORY} from scratch. "
             "Made by:", "", "```bash",
             f"python -m recipes.convert.run convert --data DATA --source {args.source}",
             "OMP_NUM_THREADS=1 python -m recipes.convert.run train {converted,original,scratch} --data DATA "
             "--source SOURCE [--write-only-updates U]",
             "python -m recipes.convert.run report --data DATA --source SOURCE", "```", "",
             "| model | updates | trained here | test BLEU | chrF | valid loss | valid nll | decoding s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, total, trained, score in rows:
        lines.append(f"| {label} | {total} | {trained} | {score['bleu']} | {score['chrf']} | "
                     f"{score['valid_loss']:.3f} | {score['valid_nll_loss']:.3f} | {score['decoding_seconds']} |")
    lines += ["", f"Long inputs: the test split's BPE joined into sources of |S| = {args.long_length} tokens "
                  "(EOS included), beam 5:", "",
              "| model | sources | decoding s | output tokens |", "| --- | ---: | ---: | ---: |"]
    for label, score in long_rows:
        lines.append(f"| {label} | {score['sentences']} | {score['decoding_seconds']} | {score['output_tokens']:.0f} |")
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None):
    os.environ["OMP_NUM_THREADS"] = "1"  # every run and evaluation on one thread
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("command", choices=("convert", "train", "report"))
    p.add_argument("run", nargs="?", choices=sorted(RUN_MODELS))
    p.add_argument("--data", required=True, type=folder_with("data-bin"),
                   help="recipes.wmt17.run prepare's output directory")
    p.add_argument("--source", type=existing_file,
                   default=os.path.join(REPO, "checkpoints", "bible", ORIGINAL, "checkpoint_last.pt"),
                   help="the transformer's checkpoint (compare.py train transformer's checkpoint_last.pt)")
    p.add_argument("--work", type=output_dir, default=os.path.join(REPO, "checkpoints", "bible", "convert"),
                   help="converted model and checkpoints")
    p.add_argument("--out", type=output_dir, default=os.path.join(REPO, "results", "bible", "convert"))
    p.add_argument("--fractions", type=positive_number, nargs="+", default=FRACTIONS,
                   help="update totals N + fraction * N to compare at")
    p.add_argument("--write-only-updates", type=non_negative_int, default=0,
                   help="train converted: the write alone for this many updates first")
    p.add_argument("--long-length", type=integer_at_least(2), default=LONG_LENGTH,
                   help="|S| of the long-input timing, EOS included")
    p.add_argument("--seed", type=non_negative_int, default=1)
    p.add_argument("--device", choices=compare.DEVICES, default="cpu",
                   help="train on cpu, or on a GPU at this precision (default cpu)")
    args, args.extra = p.parse_known_args(argv)
    if args.command == "train" and args.run is None:
        p.error("train needs a run: " + ", ".join(sorted(RUN_MODELS)))
    if args.write_only_updates and not (args.command == "train" and args.run == "converted"):
        p.error(f"argument --write-only-updates: {args.write_only_updates} trains the converted model's write "
                f"alone first: give it to train converted only")
    if args.command == "report":
        check(p, "--data", folder_with("ref/test.fr", "bpe/test.en", "bpe/test.fr"), args.data)
    model = RUN_MODELS[args.run] if args.command == "train" else MEMORY
    try:
        planned = fairseq_train_options([os.path.join(args.data, "data-bin"), "--task", "translation",
                                         "--source-lang", "en", "--target-lang", "fr", *compare.MODELS[model],
                                         *args.extra])
    except ValueError as error:
        p.error(f"{error} (options this driver does not know go to fairseq-train --arch "
                f"{compare.MODELS[model][1]})")
    if os.path.isfile(converted_path(args)) and (args.command != "train" or args.run == "converted"):
        changed = conversion_changed(args, planned)
        if changed:
            p.error(f"--work {args.work} holds a converted.pt {changed}: give another --work, or remove "
                    f"{converted_path(args)} and the runs trained from it")
    {"convert": convert, "train": train, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
