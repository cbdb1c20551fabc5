#!/usr/bin/env python
"""Decoding and training speed of memory attention, its baselines and fairseq's own `lstm`.

    OMP_NUM_THREADS=1 python -m recipes.speed.benchmark --out results/speed

Decoding: fairseq's SequenceGenerator (beam 10, batches of 20 sources), as fairseq-generate runs
it, on untrained models (2x256 bi-LSTM encoder, 2x256 decoder, 256-d embeddings, 20 symbols),
excluding model construction and data loading. Every output is forced to the source length
(min_len = max_len = L), so every model decodes exactly L + 1 steps per batch and untrained models
compare fairly. Each (model, L) cell decodes --sources sources --repeats times and reports the
median; the models take turns; a cell repeats until it has used --min-cell-seconds (short L) and
stops once it has used --max-cell-seconds (slow peers at long L).

Also reported: the bytes each beam hypothesis keeps cached for attention (what `encoder_out`
holds after beam expansion, which SequenceGenerator reorders at every step) and training
throughput (target tokens/s, forward + backward + Adam step) with and without input feeding.

Writes OUT/decode.csv, OUT/train.csv, OUT/speed.md (tables and the speed targets) and
OUT/decode_time.png; a finished cell already in OUT/decode.csv is not measured again.
OUT/settings.json records what the times depend on (--sources, --batch-size, --beam, --threads,
--train-batch-size): adding to a table measured with others is refused.
"""

import argparse
import csv
import json
import os
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.join(HERE, "..", "..", "fairseq_memattn")
from fairseq_memattn.arg_types import positive_int, positive_number
from fairseq_memattn.cli.deploy_options import check_range
from recipes.cli import command_line, output_dir, refuse_duplicates
from recipes.speed.options import changed, tensor_storages, untrained_model
from recipes.speed.report import read as read_csv, write_report

# fairseq's `lstm` at the sizes of our models (its defaults are 512-d, unidirectional).
FAIRSEQ_LSTM = ["--arch", "lstm", "--encoder-bidirectional", "--encoder-layers", "2",
                "--encoder-hidden-size", "256", "--encoder-embed-dim", "256",
                "--decoder-layers", "2", "--decoder-hidden-size", "256",
                "--decoder-embed-dim", "256", "--decoder-out-embed-dim", "256"]

# name: (label, fairseq-train arguments). Our architectures' defaults are the sizes above.
MODELS = {
    "noatt": ("No Att", ["--arch", "lstm_noatt"]),
    **{f"k{k}": (f"K={k}", ["--arch", "lstm_memattn", "--memory-k", str(k)]) for k in (1, 4, 16, 32, 64)},
    "k64_read": ("K=64, attention read", ["--arch", "lstm_memattn", "--memory-k", "64", "--memory-read", "attention"]),
    "k64_general": ("K=64, general read", ["--arch", "lstm_memattn", "--memory-k", "64", "--memory-read", "general"]),
    "att": ("Att (additive)", ["--arch", "lstm_att"]),
    # Plain dot attention needs decoder units = encoder units (512); Luong's "general" is dot
    # attention through a matrix and fits these sizes.
    "dot": ("Att (dot, Luong general)", ["--arch", "lstm_att", "--attention-type", "general"]),
    "linear": ("Linear (de Brebisson)", ["--arch", "lstm_linatt"]),
    "lstm": ("fairseq lstm, no att", FAIRSEQ_LSTM + ["--decoder-attention", "0"]),
    "lstm_att": ("fairseq lstm + att", FAIRSEQ_LSTM + ["--decoder-attention", "1"]),
}
OURS = [name for name in MODELS if not name.startswith("lstm")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=output_dir, help="directory for the tables and the plot")
    p.add_argument("--models", nargs="+", default=list(MODELS), metavar="NAME",
                   help=f"models to time (default: all of {', '.join(MODELS)})")
    p.add_argument("--lengths", nargs="*", type=positive_int, default=[10, 50, 100, 200, 400, 800], metavar="L",
                   help="source lengths to decode (none: skip decoding)")
    p.add_argument("--sources", type=positive_int, default=1000, help="sources decoded per measurement")
    p.add_argument("--batch-size", type=positive_int, default=20, help="sources per batch")
    p.add_argument("--beam", type=positive_int, default=10)
    p.add_argument("--repeats", type=positive_int, default=3, help="measurements per cell (median reported)")
    p.add_argument("--min-cell-seconds", type=float, default=0.0,
                   help="repeat a cell beyond --repeats until it has used this long (short L)")
    p.add_argument("--max-cell-seconds", type=positive_number, default=300.0,
                   help="stop repeating a cell once it has used this long (at least one measurement)")
    p.add_argument("--train-lengths", nargs="*", type=positive_int, default=[200], metavar="L",
                   help="lengths for the training-throughput table (none: skip it)")
    p.add_argument("--train-batch-size", type=positive_int, default=32)
    p.add_argument("--train-steps", type=positive_int, default=5, help="timed training steps (median reported)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (1: steady timings)")
    args = p.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        p.error(f"unknown --models {', '.join(unknown)} (choose from {', '.join(MODELS)})")
    check_range(p, args, "min_cell_seconds", 0)
    refuse_duplicates(p, args, "models", "lengths", "train_lengths")
    if args.min_cell_seconds > args.max_cell_seconds:
        p.error(f"--min-cell-seconds {args.min_cell_seconds:g} is more than --max-cell-seconds "
                f"{args.max_cell_seconds:g}")
    args.settings = checked_settings(p, args)
    return args


# What each table's measurements depend on (not how often they are repeated): a folder's rows are
# all made with the same, which settings.json records.
SETTINGS = {"decode": ("sources", "batch_size", "beam", "threads"), "train": ("train_batch_size", "threads")}
# what a table written before settings.json holds of them: {setting: its column}
IN_ROWS = {"decode": {"sources": "sources", "beam": "beam"}, "train": {"train_batch_size": "batch"}}


def checked_settings(p, args):
    """The settings to record in --out, with this run's for the tables it adds to; a table there
    measured with other settings is refused (the two would share one report)."""
    path = os.path.join(args.out, "settings.json")
    recorded = {}
    if os.path.isfile(path):
        try:
            with open(path) as f:
                recorded = json.load(f)
        except ValueError as error:
            p.error(f"{path}: not readable as JSON ({error}); give another --out")
    for table, lengths in (("decode", args.lengths), ("train", args.train_lengths)):
        if not lengths:
            continue
        now = {name: getattr(args, name) for name in SETTINGS[table]}
        rows = read_csv(os.path.join(args.out, f"{table}.csv"))
        if rows:
            before = recorded.get(table) or {name: rows[0][column] for name, column in IN_ROWS[table].items()
                                             if column in rows[0]}
            differs = changed(before, now)
            if differs:
                p.error(f"{os.path.join(args.out, table + '.csv')} holds times measured with other settings: "
                        f"{differs}; give another --out")
        recorded[table] = now
    return recorded


def build_model(name, max_len, input_feeding=False):
    """An untrained model as fairseq-train would build it (seed 0), and its task."""
    model, task, _ = untrained_model(
        ["--user-dir", PLUGIN, "--task", "copy_task", "--copy-max-len", str(max_len), "--cpu",
         "--max-source-positions", str(max_len + 2), "--max-target-positions", str(max_len + 2),
         *MODELS[name][1], *(["--input-feeding"] if input_feeding else [])])
    return model, task


def copy_batches(task, length, n_sources, batch_size):
    """n_sources random sequences of exactly `length` symbols (+ EOS), as collated batches."""
    d = task.source_dictionary
    rng = np.random.default_rng(0)
    symbols = rng.integers(d.nspecial, len(d), size=(n_sources, length))
    tokens = torch.cat([torch.from_numpy(symbols), torch.full((n_sources, 1), d.eos())], dim=1)
    return [
        {"id": torch.arange(start, min(start + batch_size, n_sources)),
         "net_input": {"src_tokens": tokens[start : start + batch_size],
                       "src_lengths": torch.full((min(batch_size, n_sources - start),), length + 1)}}
        for start in range(0, n_sources, batch_size)
    ]


def cached_bytes_per_hypothesis(model, batch, beam):
    """Bytes `encoder_out` holds per hypothesis after beam expansion (shared storage counted once)."""
    with torch.no_grad():
        encoder_out = model.encoder(**batch["net_input"])
        n = batch["net_input"]["src_tokens"].size(0)
        expanded = model.encoder.reorder_encoder_out(encoder_out, torch.arange(n).repeat_interleave(beam))
    return sum(tensor_storages(expanded).values()) / (n * beam)


def decoder_for(model, task, length, beam):
    """fairseq-generate's beam search, forced to emit exactly `length` tokens and EOS."""
    from fairseq.sequence_generator import SequenceGenerator

    return SequenceGenerator([model], task.target_dictionary, beam_size=beam,
                             max_len_a=0, max_len_b=length, min_len=length)


def time_decoding(generator, model, batches, length):
    start = time.perf_counter()
    for batch in batches:
        hypos = generator.generate([model], batch)
    seconds = time.perf_counter() - start
    steps = hypos[0][0]["tokens"].numel()
    assert steps == length + 1, f"output has {steps} tokens, expected {length + 1}"
    return seconds


def time_training(model, batch, steps):
    """Median seconds of one training step (forward, backward, Adam) on a copy batch."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    tokens = batch["net_input"]["src_tokens"]
    prev_output = torch.roll(tokens, 1, dims=1)  # EOS first, as fairseq's collater does
    times = []
    for step in range(steps + 1):  # the first step warms up
        start = time.perf_counter()
        logits, _ = model(tokens, batch["net_input"]["src_lengths"], prev_output)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def append_csv(path, row):
    new = not os.path.exists(path)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        if new:
            writer.writeheader()
        writer.writerow(row)


def benchmark_decoding(args, path):
    """For each L, the models take turns (one decode of all sources each per round), so that a
    change in the machine's load shifts every model's median alike, not just one model's."""
    done = {(r["model"], int(r["L"])) for r in read_csv(path)}
    for length in args.lengths:
        todo = [name for name in args.models if (name, length) not in done]
        cells = {}
        for name in todo:
            model, task = build_model(name, length)
            # As fairseq-generate without --print-alignment: no alignments, for every model.
            model.make_generation_fast_(need_attn=False)
            cells[name] = (model, decoder_for(model, task, length, args.beam),
                           copy_batches(task, length, args.sources, args.batch_size), [])
        def wants_more(times):
            return sum(times) < args.max_cell_seconds and (
                len(times) < args.repeats or sum(times) < args.min_cell_seconds)

        while any(wants_more(times) for *_, times in cells.values()):
            for name, (model, generator, batches, times) in cells.items():
                if wants_more(times):
                    times.append(time_decoding(generator, model, batches, length))
        for name, (model, generator, batches, times) in cells.items():
            seconds = statistics.median(times)
            row = {"model": name, "label": MODELS[name][0], "L": length, "sources": args.sources,
                   "beam": args.beam, "repeats": len(times), "seconds": f"{seconds:.4g}",  # a short cell's too
                   "ms_per_step": f"{1000 * seconds / (len(batches) * (length + 1)):.4g}",
                   "bytes_per_hypothesis": round(cached_bytes_per_hypothesis(model, batches[0], args.beam))}
            append_csv(path, row)
            print(f"decode L={length:4d} {MODELS[name][0]:26s} {seconds:9.2f} s "
                  f"({row['ms_per_step']} ms/step, {len(times)} runs)", flush=True)


def benchmark_training(args, path):
    done = {(r["model"], int(r["L"]), r["input_feeding"]) for r in read_csv(path)}
    for length in args.train_lengths:
        for name in args.models:
            # fairseq's lstm has one mode: it always feeds the previous output back.
            for feeding in ([True] if name.startswith("lstm") else [False, True]):
                if (name, length, str(feeding)) in done:
                    continue
                model, task = build_model(name, length, input_feeding=feeding and name in OURS)
                batch = copy_batches(task, length, args.train_batch_size, args.train_batch_size)[0]
                seconds = time_training(model, batch, args.train_steps)
                tokens_per_s = args.train_batch_size * (length + 1) / seconds
                append_csv(path, {"model": name, "label": MODELS[name][0], "L": length,
                                  "input_feeding": feeding, "batch": args.train_batch_size,
                                  "step_seconds": f"{seconds:.4f}", "tokens_per_s": f"{tokens_per_s:.0f}"})
                print(f"train  L={length:4d} {MODELS[name][0]:26s} input feeding {feeding!s:5s} "
                      f"{tokens_per_s:8.0f} tokens/s", flush=True)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "settings.json"), "w") as f:
        json.dump(args.settings, f)
    decode_csv, train_csv = os.path.join(args.out, "decode.csv"), os.path.join(args.out, "train.csv")
    benchmark_decoding(args, decode_csv)
    benchmark_training(args, train_csv)
    write_report(args.out, command_line("recipes.speed.benchmark", argv))


if __name__ == "__main__":
    main()
