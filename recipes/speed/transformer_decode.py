#!/usr/bin/env python
"""Decoding and training speed of transformer_memattn against fairseq's `transformer` of the same
size. The full grid, as run for results/speed/transformer.md:

    OMP_NUM_THREADS=1 python -m recipes.speed.transformer_decode --source-lens 50 200 800 2000 \\
        --target-len 50 --copy-lens 50 200 800 --sources 20 --beam 5 --repeats 3 \\
        --max-cell-seconds 60 --train-len 800 --train-steps 2 --profile-missed --out OUT.md

Untrained models (seed 0) as fairseq-train builds them, 3 + 3 layers (--layers) of 256 units (4 heads, FFN 1024),
20 symbols; one model of each kind serves every cell (positions up to the longest length + 2; the memory's
S of Eq. 10 is the longest source + EOS). Decoding: fairseq's SequenceGenerator with --beam over one
batch of --sources random sources of exactly |S| symbols, every output forced to |T| tokens
(min_len = max_len), so all models decode |T| + 1 steps. Two regimes: (a) long source, short output,
|T| = --target-len for each of --source-lens; (b) copy, |T| = |S| for each of --copy-lens.

Per cell and model: total seconds of generate(); encoder seconds (the encoder's call within that
generate(), timed by wrapping its forward); decoder ms per step = (total - encoder) / steps; KiB cached per hypothesis: what the
decoder keeps between steps, taken after the last step: `encoder_out` as beam search reordered it and
every tensor of the incremental state, summed over unique storages (a row shared by a source's
hypotheses counts once), divided by the number of hypotheses; its self-attention part (keys and values
of the target prefix, which grows with |T| for every model) is also given apart. The models take turns
within a cell; each cell runs --repeats rounds, fewer once it has used --max-cell-seconds (at least one),
and reports medians.

Training: target tokens/s of forward + backward + Adam step with fairseq's cross_entropy criterion on
one copy batch of --sources sources of --train-len symbols (|T| = |S|), median of --train-steps steps
after one warm-up step.

Prints markdown: the tables, then the speed targets (met / missed, with the measured values); with
--profile-missed, a torch.profiler summary (top ops by self CPU time, and the decoder's ms per step as
the profiler saw it) of the cells and models each missed target compares.
"""

import argparse
import contextlib
import statistics
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.join(HERE, "..", "..", "fairseq_memattn")
from fairseq_memattn.arg_types import non_negative_int, positive_int
from fairseq_memattn.cli.deploy_options import check_range
from recipes.cli import output_file, refuse_duplicates
from recipes.speed.benchmark import copy_batches, decoder_for
from recipes.speed.options import tensor_storages, untrained_model

SIZES = ["--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
         "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4"]
BASELINE = "transformer"
MODELS = {
    BASELINE: ["--arch", "transformer"],
    "memattn K=64 attention": ["--arch", "transformer_memattn", "--memory-k", "64"],
    "memattn K=64 mix": ["--arch", "transformer_memattn", "--memory-k", "64", "--memory-read", "mix"],
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source-lens", nargs="*", type=positive_int, default=[50, 200, 800, 2000], metavar="S",
                   help="(a) source lengths decoded to --target-len tokens")
    p.add_argument("--target-len", type=positive_int, default=50, help="(a) forced output length")
    p.add_argument("--copy-lens", nargs="*", type=positive_int, default=[50, 200, 800], metavar="L",
                   help="(b) copy regime: |T| = |S| = L")
    p.add_argument("--sources", type=positive_int, default=20, help="sources per batch (one batch per cell)")
    p.add_argument("--beam", type=positive_int, default=5)
    p.add_argument("--layers", nargs=2, type=positive_int, default=[3, 3], metavar=("ENCODER", "DECODER"),
                   help="encoder and decoder layers of every model (e.g. 12 1: a deep encoder and a "
                        "shallow decoder, Kasai et al. 2021)")
    p.add_argument("--repeats", type=positive_int, default=3, help="rounds per cell (medians reported)")
    p.add_argument("--max-cell-seconds", type=float, default=60.0,
                   help="no further round once a cell has used this long (at least one round)")
    p.add_argument("--train-len", type=non_negative_int, default=800, help="|S| = |T| of the training batch (0: skip)")
    p.add_argument("--train-steps", type=positive_int, default=2, help="timed training steps (median reported)")
    p.add_argument("--profile-missed", action="store_true",
                   help="profile the cells of missed targets (torch.profiler, top ops)")
    p.add_argument("--out", type=output_file, help="also write the markdown to this file")
    args = p.parse_args(argv)
    check_range(p, args, "max_cell_seconds", 0)
    refuse_duplicates(p, args, "source_lens", "copy_lens")
    if not (args.source_lens or args.copy_lens or args.train_len):
        p.error("nothing to time: give lengths to --source-lens or --copy-lens, or a --train-len")
    return args


def build(arch_args, max_len, layers=(3, 3)):
    """An untrained model as fairseq-train builds it (seed 0), its task and fairseq's cross_entropy."""
    memory = ["--memory-position-max-len", str(max_len + 1)] if "transformer_memattn" in arch_args else []
    model, task, args = untrained_model(
        ["--user-dir", PLUGIN, "--task", "copy_task", "--copy-max-len", str(max_len), "--cpu",
         "--criterion", "cross_entropy", "--max-source-positions", str(max_len + 2),
         "--max-target-positions", str(max_len + 2), "--encoder-layers", str(layers[0]),
         "--decoder-layers", str(layers[1]), *SIZES, *arch_args, *memory])
    model.eval()
    if hasattr(model.encoder, "keep_alignment"):
        # as fairseq-generate without --print-alignment (its make_generation_fast_ would also
        # forbid the training measurement): no alignments
        model.encoder.keep_alignment = False
    return model, task, task.build_criterion(args)


@contextlib.contextmanager
def watched(model):
    """During one generate(): the encoder's seconds, and what the decoder's last incremental call
    got: {"encoder", "encoder_out", "state", "hypotheses"}."""
    seen = {"encoder": 0.0}
    encoder, decoder = model.encoder.forward, model.decoder.forward

    def timed_encoder(*args, **kwargs):
        start = time.perf_counter()
        out = encoder(*args, **kwargs)
        seen["encoder"] += time.perf_counter() - start
        return out

    def recording(tokens, encoder_out=None, incremental_state=None, **kwargs):
        seen.update(encoder_out=encoder_out, state=incremental_state, hypotheses=tokens.size(0))
        return decoder(tokens, encoder_out=encoder_out, incremental_state=incremental_state, **kwargs)

    model.encoder.forward, model.decoder.forward = timed_encoder, recording
    try:
        yield seen
    finally:
        del model.encoder.forward, model.decoder.forward


def cached_kib_per_hypothesis(decoder, seen):
    """(all, self-attention part) KiB per hypothesis of `encoder_out` and the incremental state,
    each storage counted once."""
    self_attention = {layer.self_attn._incremental_state_id for layer in decoder.layers}
    storages = tensor_storages(seen["encoder_out"])
    self_bytes = 0  # of the storages a self-attention's state holds first
    for key, value in seen["state"].items():
        before = set(storages)
        tensor_storages(value, storages)
        if key.split(".")[0] in self_attention:
            self_bytes += sum(storages[ptr] for ptr in storages.keys() - before)
    per = 1024 * seen["hypotheses"]
    return sum(storages.values()) / per, self_bytes / per


def seconds(fn):
    start = time.perf_counter()
    with torch.no_grad():
        result = fn()
    return time.perf_counter() - start, result


def decode_once(model, generator, batch, target_len):
    """(encoder seconds, total seconds, KiB/hypothesis, self-attention KiB/hypothesis) of one
    generate(); the encoder is timed inside it, so the decoder's share is total - encoder."""
    with watched(model) as seen:
        total, hypos = seconds(lambda: generator.generate([model], batch))
    steps = hypos[0][0]["tokens"].numel()
    assert steps == target_len + 1, f"output has {steps} tokens, expected {target_len + 1}"
    return (seen["encoder"], total, *cached_kib_per_hypothesis(model.decoder, seen))


def measure_cell(models, source_len, target_len, args):
    """Rows {model, S, T, runs, total, encoder, ms_step, kib, kib_self} for one cell."""
    cells = {}
    for name, (model, task, _) in models.items():
        batch = copy_batches(task, source_len, args.sources, args.sources)[0]
        cells[name] = (model, decoder_for(model, task, target_len, args.beam), batch, [])
    start = time.perf_counter()
    for _ in range(args.repeats):
        for name, (model, generator, batch, runs) in cells.items():  # models take turns
            runs.append(decode_once(model, generator, batch, target_len))
        if time.perf_counter() - start > args.max_cell_seconds:
            break
    rows = []
    for name, (*_, runs) in cells.items():
        encoder, total = (statistics.median(run[i] for run in runs) for i in (0, 1))
        rows.append({"model": name, "S": source_len, "T": target_len, "runs": len(runs), "total": total,
                     "encoder": encoder, "ms_step": 1000 * (total - encoder) / (target_len + 1),
                     "kib": runs[-1][2], "kib_self": runs[-1][3]})
        print(f"<!-- |S|={source_len} |T|={target_len} {name}: {total:.2f} s, {len(runs)} runs -->",
              file=sys.stderr, flush=True)
    return rows


def training_sample(task, length, sources):
    batch = copy_batches(task, length, sources, sources)[0]
    tokens = batch["net_input"]["src_tokens"]
    # the copy task's target is its source; EOS first in the decoder's input, as fairseq's collater
    net_input = {**batch["net_input"], "prev_output_tokens": torch.roll(tokens, 1, dims=1)}
    return {**batch, "net_input": net_input, "target": tokens, "ntokens": tokens.numel()}


def train_step(model, criterion, optimizer, sample):
    loss, _, _ = criterion(model, sample)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def training_tokens_per_second(model, task, criterion, args):
    sample = training_sample(task, args.train_len, args.sources)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    times = []
    for step in range(args.train_steps + 1):  # the first step warms up
        start = time.perf_counter()
        train_step(model, criterion, optimizer, sample)
        if step:
            times.append(time.perf_counter() - start)
    model.eval()
    return sample["ntokens"] / statistics.median(times)


def speedup(rows, name, source_len, target_len):
    cell = {row["model"]: row["total"] for row in rows if (row["S"], row["T"]) == (source_len, target_len)}
    if BASELINE in cell and name in cell:
        return cell[BASELINE] / cell[name]
    return None


def decode_table(rows):
    lines = ["| \\|S\\| | \\|T\\| | model | runs | total s | encoder s | decoder ms/step | speed-up "
             "| KiB cached / hyp | of which self-attn |",
             "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        gain = speedup(rows, row["model"], row["S"], row["T"])
        lines.append(f"| {row['S']} | {row['T']} | {row['model']} | {row['runs']} | {row['total']:.2f} "
                     f"| {row['encoder']:.2f} | {row['ms_step']:.1f} | "
                     f"{'' if gain is None else f'{gain:.2f}x'} | {row['kib']:.1f} | {row['kib_self']:.1f} |")
    return lines


def targets(long_rows, copy_rows, train, args):
    """(target, model, measured, met, what to profile: [((S, T) or "train", model)]) per memattn model."""
    out = []

    def add(target, name, value, text, met, cell):
        out.append((target, name, "not measured" if value is None else text, value is not None and met, cell))

    S, T = args.source_lens, args.target_len
    for name in MODELS:
        if name == BASELINE:
            continue
        for length, wanted in ((800, 3.0), (2000, 5.0)):
            gain = speedup(long_rows, name, length, T) if length in S else None
            add(f"(a) >= {wanted:g}x faster at \\|S\\| = {length}, \\|T\\| = {T}", name, gain,
                f"{gain or 0:.2f}x", (gain or 0) >= wanted, [((length, T), m) for m in (BASELINE, name)])
        step = {row["S"]: row["ms_step"] for row in long_rows if row["model"] == name}
        ratio = step[2000] / step[50] if 2000 in step and 50 in step else None
        add("(a) decoder ms/step at \\|S\\| = 2000 <= 1.15x \\|S\\| = 50", name, ratio,
            f"{ratio or 0:.2f}x ({step.get(2000, 0):.1f} / {step.get(50, 0):.1f} ms)",
            (ratio or 9) <= 1.15, [((50, T), name), ((2000, T), name)])
        gain = speedup(copy_rows, name, 800, 800) if 800 in args.copy_lens else None
        add("(b) >= 1.5x faster at \\|T\\| = \\|S\\| = 800", name, gain, f"{gain or 0:.2f}x",
            (gain or 0) >= 1.5, [((800, 800), m) for m in (BASELINE, name)])
        kib = sorted({round(row["kib"], 1) for row in long_rows if row["model"] == name})
        add(f"cached KiB / hyp constant in \\|S\\| (\\|T\\| = {T})", name, kib or None,
            " = ".join(f"{k:g}" for k in kib) + (" at every \\|S\\|" if len(kib) == 1 else ""),
            len(kib) == 1, [((length, T), name) for length in S])
        ratio = train[name] / train[BASELINE] if BASELINE in train and name in train else None
        add(f"training tokens/s >= 0.9x transformer (\\|T\\| = \\|S\\| = {args.train_len})", name, ratio,
            f"{ratio or 0:.2f}x ({train.get(name, 0):.0f} / {train.get(BASELINE, 0):.0f})",
            (ratio or 0) >= 0.9, [("train", m) for m in (BASELINE, name)])
    return out


def profile(fn, steps=None, rows=12):
    """Markdown lines: the top ops by self CPU time of fn() and, for a decode of `steps` steps, the
    decoder's ms per step as the profiler saw it (SequenceGenerator's forward_decoder record)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.key_averages()
    lines = ["```", *events.table(sort_by="self_cpu_time_total", row_limit=rows).strip().splitlines(), "```"]
    for event in events:
        if steps and event.key == "EnsembleModel: forward_decoder":
            lines.append(f"forward_decoder: {event.cpu_time_total / 1000 / steps:.1f} ms per step "
                         f"({event.count} calls, reordering between steps not included)")
    return lines


def profiles(missed, models, args):
    lines = []
    for cell, name in dict.fromkeys(pair for *_, pairs in missed for pair in pairs):
        model, task, criterion = models[name]
        if cell == "train":
            sample = training_sample(task, args.train_len, args.sources)
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
            model.train()
            train_step(model, criterion, optimizer, sample)  # warm-up
            lines += [f"### Training step, \\|T\\| = \\|S\\| = {args.train_len}: {name}", ""]
            lines += profile(lambda: train_step(model, criterion, optimizer, sample)) + [""]
            model.eval()
            continue
        source_len, target_len = cell
        batch = copy_batches(task, source_len, args.sources, args.sources)[0]
        generator = decoder_for(model, task, target_len, args.beam)
        lines += [f"### Decoding \\|S\\| = {source_len}, \\|T\\| = {target_len}: {name}", ""]
        lines += profile(lambda: seconds(lambda: generator.generate([model], batch)), target_len + 1) + [""]
    return lines


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    max_len = max(args.source_lens + args.copy_lens + [args.target_len, args.train_len])
    models = {name: build(arch_args, max_len, args.layers) for name, arch_args in MODELS.items()}
    for model, task, _ in models.values():  # warm-up: one tiny decode each
        decode_once(model, decoder_for(model, task, 4, args.beam), copy_batches(task, 8, 2, 2)[0], 4)

    long_rows = [row for S in args.source_lens for row in measure_cell(models, S, args.target_len, args)]
    copy_rows = [row for L in args.copy_lens for row in measure_cell(models, L, L, args)]
    train = {name: training_tokens_per_second(*parts, args) for name, parts in models.items()} \
        if args.train_len else {}

    header = (f"{args.layers[0]} + {args.layers[1]} layers, beam {args.beam}, {args.sources} sources, "
              f"up to {args.repeats} rounds per cell (medians), {torch.get_num_threads()} thread")
    lines = [f"## (a) Long source, short output: \\|T\\| = {args.target_len}", "", header, "",
             *decode_table(long_rows), "", "## (b) Copy regime: \\|T\\| = \\|S\\|", "", header, "",
             *decode_table(copy_rows), ""]
    if train:
        lines += [f"## Training: target tokens/s, \\|T\\| = \\|S\\| = {args.train_len}, {args.sources} "
                  f"sources, cross_entropy, Adam; median of {args.train_steps} steps", "",
                  "| model | tokens/s | vs transformer |", "| --- | ---: | ---: |"]
        lines += [f"| {name} | {tps:.0f} | {tps / train[BASELINE]:.2f}x |" for name, tps in train.items()]
        lines.append("")
    found = targets(long_rows, copy_rows, train, args)
    lines += ["## Targets", "", "| target | model | measured | |", "| --- | --- | --- | --- |"]
    lines += [f"| {target} | {name} | {text} | {'met' if met else '' if text == 'not measured' else 'MISSED'} |"
              for target, name, text, met, _ in found]
    missed = [t for t in found if not t[3] and t[2] != "not measured"]
    if args.profile_missed and missed:
        lines += ["", "## Profiles of the missed targets' cells (torch.profiler, top ops by self CPU)", ""]
        lines += profiles(missed, models, args)
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return long_rows, copy_rows, train, found


if __name__ == "__main__":
    main()
