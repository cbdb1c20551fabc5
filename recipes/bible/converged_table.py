"""The results table of the convergence runs: what they left read and scored (sacreBLEU BLEU and chrF),
and table.md, its sections and the curves written (``converge report``; converge_cpu.py's table takes
its rows and sections from here)."""

import argparse
import fnmatch
import gzip
import json
import os
import shutil
import tarfile
import tempfile

from recipes.bible import lstm_gap
from recipes.bible.converge_settings import (AVERAGE_LAST, CONVERT_FRACTIONS, CONVERT_RUNS, GPU_BATCH,
                                             LSTM_MODELS, MODELS, PAIRS, PATIENCE, PLOTTED_EXAMPLE, VARIANTS)
from recipes.convert import run as convert_run
from recipes.train_log import read_train_log

# What run stages (and the archive holds), and what report adds beside it in --out: a report
# replaces these there and keeps anything else. Every archive holds MARKER.
MARKER = "machine.txt"
STAGED = (MARKER, "command.txt", "cuda_tests.log", "convert", *MODELS)
REPORTED = ("table.md", "curves_*.png")

BEST_RECORD = "checkpoint.json"  # in MODEL/best/: the update the decoded checkpoint_best.pt was saved at


def decoded_best(folder):
    """The update of the checkpoint_best.pt that MODEL's folder FOLDER was decoded from, or None
    (not decoded, or decoded before this was kept)."""
    record = os.path.join(folder, "best", BEST_RECORD)
    if not os.path.isfile(record):
        return None
    with open(record, encoding="utf-8") as f:
        return json.load(f)["updates"]


def score(hypotheses_path, references):
    import sacrebleu

    hypotheses = lstm_gap.read_lines(hypotheses_path)
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    return {"bleu": bleu.corpus_score(hypotheses, [references]).score,
            "chrf": chrf.corpus_score(hypotheses, [references]).score,
            "signatures": (str(bleu.get_signature()), str(chrf.get_signature()))}


def read_run(folder, references):
    """A model's folder of the archive: its training log and each checkpoint's scores."""
    run = {"log": read_train_log(os.path.join(folder, "train.log")), "checkpoints": {}}
    best_update = decoded_best(folder)
    if best_update is not None:
        run["log"]["best_update"] = best_update
    for checkpoint in ("best", "average"):
        scores = {}
        for subset in ("valid", "test"):
            hypotheses = os.path.join(folder, checkpoint, f"hyp.{subset}.fr")
            if os.path.isfile(hypotheses):
                scores[subset] = score(hypotheses, references[subset])
        if scores:
            run["checkpoints"][checkpoint] = scores
    timed = os.path.join(folder, "best", "evaluate.test.json")
    if os.path.isfile(timed):
        with open(timed, encoding="utf-8") as f:
            timing = json.load(f)
        run["ms_per_token"] = 1000 * timing["decoding_seconds"] / timing["output_tokens"]
    return run


def archive_names(path):
    """The top-level names under converged/ in the archive at PATH, or why it is not one of run's."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            names = tar.getnames()
    except (tarfile.TarError, EOFError, OSError) as error:
        raise argparse.ArgumentTypeError(f"{path}: not a readable .tar.gz ({error})")
    if f"converged/{MARKER}" not in names:
        raise argparse.ArgumentTypeError(f"{path}: no converged/{MARKER} in it (not an archive of `converge run`)")
    return {name.split("/")[1] for name in names if name.startswith("converged/")}


def replaced(out, incoming):
    """What report replaces in OUT: what run staged or report wrote there, and INCOMING (the new
    archive's names); refused (ArgumentTypeError) where OUT is neither new, empty nor an earlier
    report's (its MARKER), so that another folder's results are never deleted."""
    names = os.listdir(out) if os.path.isdir(out) else []
    if names and MARKER not in names:
        raise argparse.ArgumentTypeError(f"{out}: not empty, and no {MARKER} in it (not an earlier report's "
                                         "folder): give a new or empty folder, or an earlier report's")
    return [n for n in names if n in STAGED or n in incoming or any(fnmatch.fnmatch(n, r) for r in REPORTED)]


def report(args):
    for name in args.replaced:
        path = os.path.join(args.out, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(args.archive) as tar:
            tar.extractall(tmp, filter="data")
        for name in os.listdir(os.path.join(tmp, "converged")):
            shutil.move(os.path.join(tmp, "converged", name), os.path.join(args.out, name))
    references = read_references(args.data)
    runs = {m: read_run(os.path.join(args.out, m), references) for m in MODELS
            if os.path.isfile(os.path.join(args.out, m, "train.log"))}
    for model in runs:
        compress_outputs(os.path.join(args.out, model))
    from recipes.train_log import plot_curves

    device = run_device(args.out)
    for baseline, memory in PAIRS.items():
        compared = (baseline, memory, *(v for v, (model, _) in VARIANTS.items() if model in (baseline, memory)))
        curves = {m: runs[m]["log"]["curve"] for m in compared if m in runs}
        if curves:
            plot_curves(os.path.join(args.out, f"curves_{baseline}.png"),
                        f"Bible en-fr, {device}: {memory} against {baseline}", curves)
    table = write_table(args, device, runs, references, conversion_rows(args.out, runs, references))
    print(table)


def lstm_gap_section(folder, runs, data, references):
    """The table.md section of the LSTM models on validation (REFERENCES: its lines): how each
    stopped, its valid BLEU, repetition and BLEU by source length (lstm_gap.table), and how its
    memory is read (lstm_gap.read_statistics)."""
    trained = [m for m in LSTM_MODELS if m in runs and "valid" in runs[m]["checkpoints"].get("best", {})]
    if not any(m in VARIANTS for m in trained):
        return []
    outputs = {m: lstm_gap.read_lines(os.path.join(folder, m, "best", "hyp.valid.fr")) for m in trained}
    lines = ["## The LSTM gap, on validation", "",
             "lstm_att and lstm_memattn beside variants with the options in the column changed (`VARIANTS` in "
             "recipes/bible/converge_settings.py), all trained at once to the same stopping rule; the best checkpoint "
             "decoded on the validation split (beam 5). Repetition and BLEU by source length "
             "(`recipes.bible.lstm_gap`):", "", lstm_gap.table(outputs, references, lstm_gap.source_lengths(data, "valid")), "",
             "How each stopped, and how its memory is read (teacher-forced on the first 200 validation "
             "references; `lstm_gap.read_statistics`):", "",
             "| model | changed | stopped by | epochs | best valid loss | beta entropy / log K | max beta "
             "| alpha entropy / log S | alpha similarity |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for model in trained:
        log_ = runs[model]["log"]
        statistics_file = os.path.join(folder, model, "read_statistics.json")
        statistics = {}
        if os.path.isfile(statistics_file):
            with open(statistics_file, encoding="utf-8") as f:
                statistics = json.load(f)
        changed = " ".join(VARIANTS[model][1]) if model in VARIANTS else ""
        figures = [f"{statistics[k]:.3f}" if k in statistics else "" for k in
                   ("beta_entropy", "beta_max", "alpha_entropy", "alpha_similarity")]
        lines.append(f"| {model} | {changed} | {STOPPED[log_['stopped']]} | {log_['epochs']} | "
                     f"{log_['best_valid_loss']:.3f} | " + " | ".join(figures) + " |")
    return lines + ["", f"Attention on validation example {PLOTTED_EXAMPLE}: `MODEL/attention_valid{PLOTTED_EXAMPLE}.png`.", ""]


def length_section(folder, runs, data, references):
    """The table.md section of each pair's test outputs by source length and their repetition
    (lstm_gap.table), from the checkpoint the pair is compared on (REFERENCES: the test lines)."""
    tables = []
    for baseline, memory in PAIRS.items():
        chosen = chosen_checkpoint(runs, baseline, memory)
        paths = {m: os.path.join(folder, m, chosen, "hyp.test.fr") for m in (baseline, memory)}
        if all(m in runs and os.path.isfile(path) for m, path in paths.items()):
            outputs = {f"{m} ({chosen})": lstm_gap.read_lines(path) for m, path in paths.items()}
            tables += [lstm_gap.table(outputs, references, lstm_gap.source_lengths(data, "test")), ""]
    if not tables:
        return []
    return ["## Test BLEU by source length", "",
            "Each pair on the checkpoint it is compared on, the test split cut by source length in BPE tokens "
            "(EOS included; K = 64 memory rows); repeated trigrams: a trigram that already occurred in the "
            "same hypothesis (`recipes.bible.lstm_gap`).", "", *tables]


def conversion_rows(folder, runs, references):
    """(label, updates, fine-tuning updates, score) of what ``convert`` left in FOLDER/convert: the
    source (the transformer's best checkpoint), the converted model and each fine-tuned checkpoint;
    each score with its validation loss as fairseq-train logged it at that update, where it did."""
    out = os.path.join(folder, "convert")
    if not os.path.isfile(os.path.join(out, "source.json")) or "transformer" not in runs:
        return []
    with open(os.path.join(out, "source.json"), encoding="utf-8") as f:
        source = json.load(f)
    updates, rows = source["updates"], []

    def add(label, hypotheses_folder, total, curve):
        hypotheses = os.path.join(hypotheses_folder, "hyp.test.fr")
        if os.path.isfile(hypotheses):
            rows.append((label, total, total - updates,
                         {**score(hypotheses, references["test"]), "valid_loss": dict(curve).get(total)}))

    add("transformer (the source)", os.path.join(folder, "transformer", "best"), updates,
        runs["transformer"]["log"]["curve"])
    add("converted, before fine-tuning", os.path.join(out, "converted_0"), updates, [])
    for total in convert_run.totals(updates, source["fractions"]):
        for run in CONVERT_RUNS:
            train_log = os.path.join(out, run, convert_run.RUN_MODELS[run], "train.log")
            curve = read_train_log(train_log)["curve"] if os.path.isfile(train_log) else []
            add(run, os.path.join(out, f"{run}_{total}"), total, curve)
    return rows


def conversion_section(rows, fractions, valid_loss_source):
    """The table.md section of the converted transformer: ROWS as ``conversion_rows`` gives them,
    fine-tuned for FRACTIONS of the source's updates."""
    if not rows:
        return []
    lines = ["## The converged transformer converted to transformer_memattn", "",
             "The transformer's best checkpoint above (N updates), converted with K = 64 and the position "
             "window, the write starting at the nearest states (`fairseq-memattn-convert`), then fine-tuned for "
             + " and ".join(f"{f:.0%}".replace("%", " %") for f in fractions) + " of N: all parameters "
             "(`converted`)" + (", or the write alone, every other weight as converted (`converted_writeU`, "
                                "for U updates)" if any(row[0].startswith("converted_write") for row in rows) else "")
             + "; beside it the transformer continued from the same checkpoint for as long (`original`). All keep "
             "the checkpoint's optimizer state and schedule (`recipes/convert/run.py`). Test sacreBLEU and chrF, "
             f"beam 5; validation loss (label-smoothed) {valid_loss_source}.", "",
             "| model | updates | fine-tuned | test BLEU | chrF | valid loss |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for label, total, trained, result in rows:
        loss = "" if result.get("valid_loss") is None else f"{result['valid_loss']:.3f}"
        lines.append(f"| {label} | {total} | {trained} | {result['bleu']:.2f} | {result['chrf']:.2f} | {loss} |")
    return lines + [""]


def read_references(data):
    """{subset: reference lines} of valid and test, from prepare's DATA/ref/."""
    return {subset: lstm_gap.read_lines(os.path.join(data, "ref", f"{subset}.fr")) for subset in ("valid", "test")}


def compress_outputs(folder):
    """fairseq-generate's outputs below FOLDER gzipped in place, as the copy task keeps them."""
    for top, _, names in os.walk(folder):
        for name in names:
            if name.startswith("generate.") and name.endswith(".txt"):
                path = os.path.join(top, name)
                with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as z:
                    shutil.copyfileobj(f, z)
                os.remove(path)


# chosen_checkpoint in words, for the tables
CHOSEN_CHECKPOINT = (f"Test scores from the best checkpoint and from the average of the last {AVERAGE_LAST} "
                     "epochs'; the pair is compared on the average where it is better on validation for both "
                     "models, else on the best.")


def chosen_checkpoint(runs, baseline, memory):
    """The averaged checkpoint where it beats the best one on validation BLEU for both models."""
    def valid_bleu(run, checkpoint):
        return run["checkpoints"].get(checkpoint, {}).get("valid", {}).get("bleu", -1)

    pair = [runs[m] for m in (baseline, memory) if m in runs]
    return "average" if pair and all(valid_bleu(r, "average") > valid_bleu(r, "best") >= 0 for r in pair) else "best"


STOPPED = {"converged": "patience", "time": "wall-clock cap", "cap": "--max-update",
           "max-epoch": "--max-epoch", "running": "still running", "no epoch": "no epoch yet",
           None: "did not finish"}
TABLE_HEADER = ["| model | device | stopped by | updates | epochs | best valid loss (update) | test BLEU, best "
                "| chrF, best | test BLEU, average | chrF, average | chosen on valid | BLEU vs baseline (chosen) "
                "| ms / token |",
                "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]


def pair_rows(runs, device):
    """Table rows (TABLE_HEADER's columns) of each pair's models that RUNS has, its VARIANTS after
    them, and the sacreBLEU signatures they used. A memory model is compared with the baseline on
    the checkpoint chosen for the two of them."""
    rows, signatures = [], set()
    for baseline, memory in PAIRS.items():
        variants = [v for v, (model, _) in VARIANTS.items() if model in (baseline, memory)]
        for model in (baseline, memory, *variants):
            if model not in runs:
                continue
            chosen = chosen_checkpoint(runs, baseline, memory if model == baseline else model)
            run, log_ = runs[model], runs[model]["log"]
            tests = {c: run["checkpoints"].get(c, {}).get("test") for c in ("best", "average")}
            bleu = tests[chosen]["bleu"] if tests[chosen] else None
            base_test = runs[baseline]["checkpoints"].get(chosen, {}).get("test") if baseline in runs else None
            delta = (f"{bleu - base_test['bleu']:+.2f}" if model != baseline and None not in (bleu, base_test)
                     else "")
            scores = [f"{tests[c][metric]:.2f}" if tests[c] else "" for c in ("best", "average")
                      for metric in ("bleu", "chrf")]
            cells = [model, device, STOPPED[log_["stopped"]], log_["updates"], log_["epochs"],
                     f"{log_['best_valid_loss']:.3f} ({log_['best_update']})" if log_["curve"] else "", *scores,
                     chosen if tests[chosen] else "", delta,
                     f"{run['ms_per_token']:.2f}" if "ms_per_token" in run else ""]
            rows.append("| " + " | ".join(map(str, cells)) + " |")
            signatures.update(s for t in tests.values() if t for s in t["signatures"])
    return rows, signatures


def machine_lines(folder):
    return [l for l in lstm_gap.read_lines(os.path.join(folder, MARKER)) if l]


def run_device(folder):
    """"GPU" or "CPU": where the archive in FOLDER was made (its machine.txt)."""
    return "GPU" if any(l.startswith("gpu ") for l in machine_lines(folder)) else "CPU"


def run_commands(folder, device):
    """The commands that made the archive: the driver's own command line where the archive kept it."""
    kept = os.path.join(folder, "command.txt")
    if os.path.isfile(kept):
        return lstm_gap.read_lines(kept)
    if device == "GPU":
        return ["python -m recipes.bible.converge pack --data DATA",
                "bash recipes/bible/converge_gpu.sh --out OUT            # on the GPU machine"]
    return ["python -m recipes.bible.converge run --cpu --out OUT   # this archive did not keep its options"]


def write_table(args, device, runs, references, converted=()):
    rows, signatures = pair_rows(runs, device)
    lines = [f"# Bible en-fr at convergence: memory attention against its baseline, on one {device}", "",
             f"Machine: {'; '.join(machine_lines(args.out))}. Test split (Romans), beam 5, sacreBLEU on "
             f"detokenised text. The models trained side by side on the one {device} (`recipes/bible/converge.py "
             f"run`), each until {PATIENCE} epochs without a better validation loss, the wall-clock cap or "
             "--max-update; each model's fairseq-train command is in `MODEL/command.txt` (by default batches of "
             + "; ".join(f"{b} and {m} {' '.join(GPU_BATCH[b])}" for b, m in PAIRS.items()) +
             f", the rest as in `recipes/bible/compare.py`). {CHOSEN_CHECKPOINT} ms / token: the test split decoded "
             f"alone on the {device} (batches of 128, fairseq-generate's timer), per output token.", "", "```bash",
             *run_commands(args.out, device),
             "python -m recipes.bible.converge report OUT/converged.tar.gz --data DATA", "```", "",
             *TABLE_HEADER, *rows, "", "Signatures: " + "; ".join(f"`{s}`" for s in sorted(signatures)), "",
             *length_section(args.out, runs, args.data, references["test"]),
             *conversion_section(converted, CONVERT_FRACTIONS, "as fairseq-train logged it at that update"),
             *lstm_gap_section(args.out, runs, args.data, references["valid"])]
    tests = os.path.join(args.out, "cuda_tests.log")
    if os.path.isfile(tests):
        summary = [l for l in open(tests, encoding="utf-8").read().splitlines() if l.strip()]
        lines += [f"CUDA-only tests (`pytest -k cuda`): {summary[-1] if summary else 'no output'}", ""]
    text = "\n".join(lines)
    with open(os.path.join(args.out, "table.md"), "w", encoding="utf-8") as f:
        f.write(text)
    return text
