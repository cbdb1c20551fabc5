#!/usr/bin/env python
"""Copy task, Transformers: `transformer_memattn` against fairseq's `transformer` of the same size
at an equal budget.

    OMP_NUM_THREADS=1 python -m recipes.copy.transformer_quality --out results/copy/transformer

Every model: 2 + 2 layers of 128 units, 4 heads, FFN 512, no dropout, Adam (0.9, 0.98) at 1e-3 with
1,000 warm-up updates (inverse square root), batches of 64, the same --updates for all (the budget),
validation every 250 updates, the best checkpoint by validation loss decoded with beam 10 and
--min-len 0 (recipes/copy/train_eval.sh). Memory models: K = 32 and 64, both reads (attention over
the K rows, the paper's mix c = beta C), the write as the architecture's defaults have it (softmax
over time, no position encodings, the position window with the attention read; --memory-args changes
that).
Writes OUT/table.md and OUT/curves_L{L}.png; resumable (a run with a score.json is kept; a run
under OUT trained with other settings is refused, so that the table never shows it under this
command). Exits 1 if a run failed.
"""

import argparse
import os
import shlex
import sys

from fairseq_memattn.arg_types import positive_int
from recipes.cli import command_line, output_dir
from recipes.copy.sweep import (changed_options, plot_curves, read_run, read_train_log, refuse_changed,
                                report_failed, train_and_score, train_options)

SIZES = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "128",
         "--decoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512",
         "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--dropout", "0",
         "--share-decoder-input-output-embed"]
MODELS = {
    "transformer": ["--arch", "transformer"],
    "K=32 attention": ["--arch", "transformer_memattn", "--memory-k", "32", "--memory-read", "attention"],
    "K=32 mix": ["--arch", "transformer_memattn", "--memory-k", "32", "--memory-read", "mix"],
    "K=64 attention": ["--arch", "transformer_memattn", "--memory-k", "64", "--memory-read", "attention"],
    "K=64 mix": ["--arch", "transformer_memattn", "--memory-k", "64", "--memory-read", "mix"],
}


def training():
    """fairseq-train's options but the budget (train_and_score passes --max-update)."""
    return [*SIZES, "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "1e-3",
            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "1000", "--clip-norm", "1",
            "--batch-size", "64", "--validate-interval-updates", "250",
            "--save-interval-updates", "250", "--validate-interval", "1000", "--save-interval", "1000",
            "--keep-interval-updates", "1", "--max-source-positions", "256",
            "--max-target-positions", "256", "--cpu"]


def run_name(length, model):
    return f"L{length}_{model.replace(' ', '_').replace('=', '')}"


def write_table(out, results, lengths, models, command):
    lines = [f"Made by `{command}`.", "",
             "BLEU / exact-copy accuracy (%) on the test split; best validation loss (at update), "
             "all at the same number of updates.", "",
             "| model | " + " | ".join(f"L = {n}" for n in lengths) + " |",
             "| --- |" + " ---: |" * len(lengths)]
    for model in models:
        cells = []
        for length in lengths:
            r = results.get((length, model))
            cells.append(f"{r['bleu']:.2f} / {r['accuracy']:.1f}; {r['best_valid_loss']:.3f} "
                         f"({r['best_update']})" if r else "")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=output_dir, default="results/copy/transformer")
    p.add_argument("--lengths", type=positive_int, nargs="+", default=[20, 50])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--updates", type=positive_int, default=3000, help="the budget, equal for every model")
    p.add_argument("--seed", type=positive_int, default=1)
    p.add_argument("--memory-args", default="",
                   help="more fairseq-train options for the memory models, e.g. "
                        "'--memory-encoder-normalize time'")
    args = p.parse_args(argv)
    try:
        memory_args = shlex.split(args.memory_args)
    except ValueError as error:
        p.error(f"--memory-args {args.memory_args!r}: {error}")

    def options(model):
        return [*MODELS[model], *(memory_args if model != "transformer" else []), *training()]

    # Before anything trains: fairseq-train takes every model's options, and no run under --out
    # was trained with others (its score would be shown under this command).
    changed = {}
    for length in args.lengths:
        for model in args.models:
            try:
                changed[run_name(length, model)] = changed_options(
                    os.path.join(args.out, run_name(length, model)), f"--copy-max-len {length}",
                    train_options(options(model), args.seed, args.updates))
            except ValueError as error:  # only --memory-args can be wrong
                p.error(f"--memory-args {args.memory_args!r}: {error}")
    refuse_changed(p, args.out, changed)
    os.makedirs(args.out, exist_ok=True)
    command = command_line("recipes.copy.transformer_quality", argv)
    results, failed = {}, []
    for length in args.lengths:
        for model in args.models:
            run_dir = os.path.join(args.out, run_name(length, model))
            if not os.path.exists(os.path.join(run_dir, "score.json")):
                if not train_and_score(run_dir, f"--copy-max-len {length}", options(model), args.seed,
                                       cap=args.updates):
                    failed.append(run_dir)
            if os.path.exists(os.path.join(run_dir, "score.json")):
                results[(length, model)] = read_run(run_dir)
            write_table(args.out, results, args.lengths, args.models, command)
        curves = {model: read_train_log(os.path.join(args.out, run_name(length, model), "train.log"))["curve"]
                  for model in args.models
                  if os.path.exists(os.path.join(args.out, run_name(length, model), "train.log"))}
        plot_curves(os.path.join(args.out, f"curves_L{length}.png"),
                    f"copy task, L = {length}: Transformers at an equal budget", curves)
    return report_failed(failed)


if __name__ == "__main__":
    sys.exit(main())
