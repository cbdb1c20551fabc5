#!/usr/bin/env python
"""Quality on real data at an equal CPU budget: memory attention against its peers on the
offline en-fr Bible corpus (public-domain translations, split by book; recipes/bible/corpus.py).

    python -m recipes.bible.corpus data/bible/raw                       # 29,518 / 1,151 / 433 verses
    python -m recipes.wmt17.run prepare en-fr --raw-dir data/bible/raw --out data/bible/en-fr \\
        --vocab-size 8000                                                   # joint sentencepiece BPE
    OMP_NUM_THREADS=1 python -m recipes.bible.compare train transformer_memattn --data data/bible/en-fr
    OMP_NUM_THREADS=1 python -m recipes.bible.compare train transformer --data data/bible/en-fr
    python -m recipes.bible.compare report --data data/bible/en-fr           # evaluate, table, curves

Each model trains for the same number of updates (--max-update, the budget; one thread each, the
pair side by side so that both see the same machine) and keeps the checkpoint with the best
validation loss; ``report`` decodes the test split (Romans) of every finished run with beam 5, removes the BPE and
scores with sacreBLEU (``recipes.wmt17.run evaluate``), then writes OUT/table.md (a table per baseline) and
OUT/curves_BASELINE.png (its memory models' validation curves beside its own). Re-running
``train`` resumes from the run's checkpoint_last.pt; ``report`` skips finished evaluations.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PLUGIN = os.path.join(REPO, "fairseq_memattn")
from fairseq_memattn.arg_types import positive_int
from recipes.bible.options import prepared
from recipes.cli import output_dir
from recipes.train_log import plot_curves, read_train_log, run_logged
from recipes.wmt17.run import fairseq_tool

# A small Transformer (3 + 3 layers of 256 units, 4 heads, FFN 1024), the same for both.
SMALL_TRANSFORMER = ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
                     "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
                     "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
                     "--decoder-attention-heads", "4", "--share-decoder-input-output-embed",
                     "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "1e-3",
                     "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "1000", "--dropout", "0.3",
                     "--weight-decay", "0.0001", "--criterion", "label_smoothed_cross_entropy",
                     "--label-smoothing", "0.1", "--max-tokens", "4096"]
# The paper's LSTM (Sec. 4.2) at CPU size: 256 units, Adam 1e-3, batches of 64 sentences.
SMALL_LSTM = ["--encoder-hidden-size", "256", "--decoder-hidden-size", "256",
              "--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--dropout", "0.2",
              "--optimizer", "adam", "--lr", "1e-3", "--clip-norm", "1", "--batch-size", "64",
              "--criterion", "cross_entropy"]
MODELS = {
    "transformer": ["--arch", "transformer_iwslt_de_en", *SMALL_TRANSFORMER],
    # Without the position window (run before it became the attention read's default).
    "transformer_memattn": ["--arch", "transformer_memattn_iwslt_de_en", "--memory-k", "64",
                            "--no-memory-position-window", *SMALL_TRANSFORMER],
    # The same with each context's write starting as a soft window over its stretch of the source.
    "transformer_memattn_window": ["--arch", "transformer_memattn_iwslt_de_en", "--memory-k", "64",
                                   "--memory-position-window", *SMALL_TRANSFORMER],
    "lstm_att": ["--arch", "lstm_memattn_wmt", "--attention-type", "additive",
                 "--no-memory-position-encoding", *SMALL_LSTM],
    # Table 2's best row: K = 64 with position encodings, encoder sigmoid / decoder softmax
    # (recipes.wmt17.run.DEFAULT_SCORES, chosen on validation).
    "lstm_memattn": ["--arch", "lstm_memattn_wmt", "--attention-type", "memory", "--memory-k", "64",
                     "--memory-position-encoding", "--memory-encoder-score", "sigmoid",
                     "--memory-decoder-score", "softmax", *SMALL_LSTM],
    # The same with the Transformer's position window added (each C_k starts on its own stretch).
    "lstm_memattn_window": ["--arch", "lstm_memattn_wmt", "--attention-type", "memory", "--memory-k", "64",
                            "--memory-position-encoding", "--memory-position-window",
                            "--memory-encoder-score", "sigmoid", "--memory-decoder-score", "softmax",
                            *SMALL_LSTM],
}
# Each baseline and the memory models measured against it (a table and a curve plot each).
COMPARISONS = {"transformer": ("transformer_memattn", "transformer_memattn_window"),
               "lstm_att": ("lstm_memattn", "lstm_memattn_window")}


DEVICES = ("cpu", "fp16", "bf16", "amp")


def device_flags(device):
    """fairseq-train's options for DEVICE: --cpu, or a GPU's precision (--fp16, --bf16, --amp)."""
    return ["--cpu"] if device == "cpu" else [f"--{device}"]


def train(args):
    run = os.path.join(args.out, args.model)
    os.makedirs(run, exist_ok=True)
    command = [fairseq_tool("fairseq-train"), os.path.join(args.data, "data-bin"), "--user-dir", PLUGIN,
               "--task", "translation", "--source-lang", "en", "--target-lang", "fr",
               *MODELS[args.model], "--max-update", str(args.max_update), "--seed", str(args.seed),
               "--max-source-positions", "256", "--max-target-positions", "256",
               "--skip-invalid-size-inputs-valid-test", "--required-batch-size-multiple", "1",
               "--no-epoch-checkpoints", "--save-dir", os.path.join(args.checkpoints, args.model),
               "--log-format", "simple", "--log-interval", "50", *device_flags(args.device), *args.extra]
    log = os.path.join(run, "train.log")
    code = run_logged(command, log)
    if code:
        print(f"fairseq-train failed (exit {code}): see {log}", file=sys.stderr)
    return code


def decode_test(checkpoint, data, out, extra=()):
    """recipes.wmt17.run evaluate's result (beam 5) for the test split of DATA; its log in OUT/evaluate.log."""
    result = subprocess.run([sys.executable, "-m", "recipes.wmt17.run", "evaluate", "en-fr", checkpoint,
                             "--data", data, "--gpus", "0", "--out", out, "--beam", "5", *extra],
                            capture_output=True, text=True, cwd=REPO)
    with open(os.path.join(out, "evaluate.log"), "w", encoding="utf-8") as f:
        f.write(result.stdout + result.stderr)
    if result.returncode != 0:
        sys.exit(f"evaluation of {checkpoint} failed: see {out}/evaluate.log")
    return json.loads(result.stdout.strip().splitlines()[-1])


def report(args):
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for model in MODELS:
        run = os.path.join(args.out, model)
        checkpoint = os.path.join(args.checkpoints, model, "checkpoint_best.pt")
        if not os.path.isfile(os.path.join(run, "train.log")):
            continue
        log = read_train_log(os.path.join(run, "train.log"))
        if not log["curve"]:
            print(f"{model}: no validation in {run}/train.log (its training failed at the start, or is in its "
                  "first epoch): left out", file=sys.stderr)
            continue
        score_file = os.path.join(run, "score.json")
        # Only a finished run is evaluated: a score kept from a checkpoint still training would be stale.
        if not os.path.isfile(score_file) and log["stopped"] is not None and os.path.isfile(checkpoint):
            score = decode_test(checkpoint, args.data, run)
            with open(score_file, "w", encoding="utf-8") as f:
                f.write(json.dumps(score) + "\n")
        score = json.load(open(score_file)) if os.path.isfile(score_file) else {}
        rows.append((model, log, score))
    write_table(args.out, rows)
    curves = {model: log["curve"] for model, log, _ in rows}
    for baseline, memory_models in COMPARISONS.items():  # their losses differ (label smoothing or not)
        present = {m: curves[m] for m in (baseline, *memory_models) if m in curves}
        if present:
            plot_curves(os.path.join(args.out, f"curves_{baseline}.png"),
                        f"Bible en-fr: memory attention against {baseline}", present)


def write_table(out, rows):
    """OUT/table.md: one table per baseline and its memory models (the same number of updates)."""
    by_model = {model: (log, score) for model, log, score in rows}
    lines = ["# Bible en-fr: memory attention against its baseline at an equal number of updates", "",
             "Test split (Romans), beam 5, sacreBLEU on detokenised text (`recipes.wmt17.run evaluate`); the "
             "checkpoint with the best validation loss. Made by, one model at a time (the exact "
             "fairseq-train command heads each MODEL/train.log):", "", "```bash",
             "python -m recipes.bible.corpus RAW",
             "python -m recipes.wmt17.run prepare en-fr --raw-dir RAW --out DATA --vocab-size 8000",
             "OMP_NUM_THREADS=1 python -m recipes.bible.compare train MODEL --data DATA --max-update N",
             "python -m recipes.bible.compare report --data DATA", "```"]
    for baseline, memory_models in COMPARISONS.items():
        present = [m for m in (baseline, *memory_models) if m in by_model]
        if not present:
            continue
        lines += ["", f"## Against {baseline}", "",
                  "| model | updates | training wall (s) | best valid loss (at update) | test BLEU (beam 5) "
                  "| vs baseline | decoding s |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        base_bleu = by_model.get(baseline, (None, {}))[1].get("bleu")
        for model in present:
            log, score = by_model[model]
            bleu = score.get("bleu")
            delta = f"{bleu - base_bleu:+.2f}" if model != baseline and None not in (bleu, base_bleu) else ""
            lines.append(f"| {model} | {log['updates']} | {log['train_seconds']:.0f} | "
                         f"{log['best_valid_loss']:.3f} ({log['best_update']}) | {'' if bleu is None else bleu} "
                         f"| {delta} | {score.get('decoding_seconds', '')} |")
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("train", "report"))
    p.add_argument("model", nargs="?", choices=sorted(MODELS))
    p.add_argument("--data", required=True, type=prepared("data-bin", "ref/test.fr"),
                   help="recipes.wmt17.run prepare's output directory")
    p.add_argument("--out", type=output_dir, default=os.path.join(REPO, "results", "bible"))
    p.add_argument("--checkpoints", type=output_dir, default=os.path.join(REPO, "checkpoints", "bible"))
    p.add_argument("--max-update", type=positive_int, default=2000, help="the budget, equal for every model")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", choices=DEVICES, default="cpu", help="cpu, or a GPU's precision (default cpu)")
    args, args.extra = p.parse_known_args(argv)  # train: the rest goes to fairseq-train
    if args.command == "report" and args.extra:
        p.error(f"unrecognized arguments: {' '.join(args.extra)}")
    if args.command == "train":
        if args.model is None:
            p.error("train needs a model: " + ", ".join(sorted(MODELS)))
        sys.exit(train(args))
    report(args)


if __name__ == "__main__":
    main()
