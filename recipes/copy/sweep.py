#!/usr/bin/env python
"""Reproduce the paper's Table 1 and Figure 3 on the copy task.

    python recipes/copy/sweep.py --preset cpu --out results/copy      # L in {20, 50}, ~2 h on 2 cores
    python recipes/copy/sweep.py --preset paper --out results/copy    # the paper's settings (GPU)

Every run is one call of recipes/copy/train_eval.sh (fairseq-train, fairseq-generate with beam 10,
scoring); a finished run (its score.json exists) is skipped, so an interrupted sweep resumes.
Writes OUT/table.md and OUT/table.csv (BLEU, accuracy, decode time, training steps, beside the
paper's BLEU) and OUT/fig3a.png (validation loss vs steps for each model at one L) and
OUT/fig3b.png (the four encoder/decoder scoring combinations).
"""

import argparse
import csv
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Paper Table 1: BLEU (decode time in seconds on a K40m) per length and model.
PAPER = {
    20: {"No Att": (99.93, 2.03), "K=1": (99.52, 2.12), "K=4": (99.56, 2.25), "K=16": (99.56, 2.21),
         "K=32": (99.57, 2.59), "K=64": (99.75, 2.86), "Att": (99.98, 2.86)},
    50: {"No Att": (97.37, 3.90), "K=1": (98.86, 4.33), "K=4": (99.95, 4.48), "K=16": (99.96, 4.58),
         "K=32": (99.96, 5.35), "K=64": (99.97, 5.84), "Att": (99.94, 6.46)},
    100: {"No Att": (73.99, 6.33), "K=1": (87.42, 7.32), "K=4": (99.81, 7.47), "K=16": (99.97, 7.50),
          "K=32": (99.99, 7.65), "K=64": (100.00, 7.77), "Att": (100.00, 11.00)},
    200: {"No Att": (32.64, 9.10), "K=1": (44.22, 9.30), "K=4": (98.54, 9.49), "K=16": (99.98, 9.53),
          "K=32": (100.00, 9.59), "K=64": (100.00, 9.78), "Att": (100.00, 14.28)},
}
MODELS = ["No Att", "K=1", "K=4", "K=16", "K=32", "K=64", "Att"]

PRESETS = {
    # Sec. 4.1: 2x256 bi-LSTM encoder, 2x256 decoder, 256-d embeddings, dropout 0.2 (the
    # architecture defaults), Adam 1e-4, batch 128, up to 200k steps, 100k/1k examples.
    "paper": dict(
        lengths=[20, 50, 100, 200],
        train=["--optimizer", "adam", "--lr", "1e-4", "--batch-size", "128", "--max-update", "200000",
               "--validate-interval-updates", "2000", "--save-interval-updates", "2000",
               "--keep-interval-updates", "1"],
        fig3a_length=200, fig3b=(200, 32),
    ),
    # CPU: half-size model (2x128 units, 64-d embeddings), no dropout, a 30x larger learning rate
    # and 3,000 steps of batch 64, so that L <= 50 finishes in about 2 hours on 2 cores.
    "cpu": dict(
        lengths=[20, 50],
        train=["--encoder-hidden-size", "128", "--decoder-hidden-size", "128",
               "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--dropout", "0",
               "--optimizer", "adam", "--lr", "3e-3", "--clip-norm", "1", "--batch-size", "64",
               "--max-update", "3000", "--validate-interval-updates", "300",
               "--save-interval-updates", "300", "--keep-interval-updates", "1", "--cpu"],
        fig3a_length=50, fig3b=(20, 16),
    ),
}


def model_args(model):
    if model == "No Att":
        return ["--arch", "lstm_noatt"]
    if model == "Att":
        return ["--arch", "lstm_att"]
    return ["--arch", "lstm_memattn", "--memory-k", model.split("=")[1]]


def run_name(length, model, scores=("softmax", "softmax")):
    name = f"L{length}_{model.replace(' ', '').replace('=', '')}"
    return name if scores == ("softmax", "softmax") else f"{name}_{scores[0]}-{scores[1]}"


def run(out, name, length, args, preset, seed):
    run_dir = os.path.join(out, "runs", name)
    if os.path.exists(os.path.join(run_dir, "score.json")):
        print(f"== {name}: done already, skipped", flush=True)
    else:
        print(f"== {name}: training", flush=True)
        env = {**os.environ, "COPY_ARGS": f"--copy-max-len {length}"}
        subprocess.run([os.path.join(HERE, "train_eval.sh"), run_dir, *args, *PRESETS[preset]["train"],
                        "--seed", str(seed), "--no-progress-bar", "--log-interval", "100"],
                       env=env, check=True)
    return read_run(run_dir)


def read_run(run_dir):
    with open(os.path.join(run_dir, "score.json")) as f:
        result = json.load(f)
    curve = []  # (updates, validation loss)
    with open(os.path.join(run_dir, "train.log")) as f:
        for line in f:
            m = re.search(r"\| valid \|.*\| loss ([\d.]+) .*\| num_updates (\d+)", line)
            if m:
                curve.append((int(m.group(2)), float(m.group(1))))
    with open(os.path.join(run_dir, "train.log")) as f:
        trained = re.search(r"done training in ([\d.]+) seconds", f.read())
    with open(os.path.join(run_dir, "generate.log")) as f:
        m = re.search(r"Translated [\d,]+ sentences .* in ([\d.]+)s", f.read())
    result.update(curve=curve, steps=curve[-1][0] if curve else 0,
                  train_seconds=float(trained.group(1)) if trained else float("nan"),
                  decode_seconds=float(m.group(1)) if m else float("nan"))
    return result


def write_table(out, rows):
    fields = ["L", "model", "bleu", "accuracy", "decode_seconds", "steps", "train_seconds",
              "paper_bleu", "paper_seconds"]
    with open(os.path.join(out, "table.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write("| L | model | BLEU | accuracy % | decode s (test, beam 10) | steps | train s "
                "| paper BLEU | paper s |\n")
        f.write("|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['L']} | {r['model']} | {r['bleu']:.2f} | {r['accuracy']:.1f} | "
                    f"{r['decode_seconds']:.1f} | {r['steps']} | {r['train_seconds']:.0f} "
                    f"| {r['paper_bleu']} | {r['paper_seconds']} |\n")


def plot_curves(path, title, curves):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in curves.items():
        if curve:
            ax.plot(*zip(*curve), marker=".", label=label)
    ax.set(xlabel="training steps", ylabel="validation loss (base 2)", yscale="log", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--out", default="results/copy")
    parser.add_argument("--lengths", type=int, nargs="+", help="override the preset's lengths")
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    lengths = args.lengths or preset["lengths"]
    bad = [n for n in lengths if n not in PAPER]
    if bad:
        parser.error(f"--lengths: {bad} not in the paper's grid (choose from {sorted(PAPER)})")
    os.makedirs(args.out, exist_ok=True)

    rows, fig3a = [], {}
    for length in lengths:
        for model in args.models:
            result = run(args.out, run_name(length, model), length, model_args(model), args.preset, args.seed)
            paper_bleu, paper_seconds = PAPER[length][model]
            rows.append({"L": length, "model": model, **result,
                         "paper_bleu": paper_bleu, "paper_seconds": paper_seconds})
            if length == preset["fig3a_length"]:
                fig3a[model] = result["curve"]
            write_table(args.out, rows)  # after every run, so progress is visible
    if fig3a:
        plot_curves(os.path.join(args.out, "fig3a.png"),
                    f"Fig. 3a: copy task, L = {preset['fig3a_length']}", fig3a)

    length, k = preset["fig3b"]
    fig3b = {}
    for scores in [("softmax", "softmax"), ("softmax", "sigmoid"), ("sigmoid", "softmax"), ("sigmoid", "sigmoid")]:
        args_k = model_args(f"K={k}") + ["--memory-encoder-score", scores[0], "--memory-decoder-score", scores[1]]
        result = run(args.out, run_name(length, f"K={k}", scores), length, args_k, args.preset, args.seed)
        fig3b[f"encoder {scores[0]}, decoder {scores[1]} (BLEU {result['bleu']:.1f})"] = result["curve"]
        if scores != ("softmax", "softmax"):  # that one is the grid's K=k row
            rows.append({"L": length, "model": f"K={k}, {scores[0]}/{scores[1]}", **result,
                         "paper_bleu": "", "paper_seconds": ""})
            write_table(args.out, rows)
    plot_curves(os.path.join(args.out, "fig3b.png"),
                f"Fig. 3b: scoring functions, L = {length}, K = {k}", fig3b)
    print(open(os.path.join(args.out, "table.md")).read())


if __name__ == "__main__":
    sys.exit(main())
