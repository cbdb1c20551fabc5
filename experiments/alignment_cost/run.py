#!/usr/bin/env python
"""What transformer_memattn's alignments cost in eval mode: validation (the decoder's teacher-forced
forward, as fairseq-train's validation, fairseq-validate and --eval-bleu run it) and decoding with
alignments (fairseq-generate --print-alignment: SequenceGeneratorWithAlignment on a model made
generation-fast with need_attn), against the same calls without alignments.

    OMP_NUM_THREADS=1 python -m experiments.alignment_cost.run --source-len 2000 --sources 8 \\
        --target-len 50 --beam 5 --repeats 3

An alignment over source positions is a layer's read weights times alpha^T (Sec. 5): O(K |S|) per
query, where the read itself is O(K d). fairseq uses one layer's (``alignment_layer``, the last by
default). Untrained models as transformer_decode.py builds them (256 units, 4 heads, K = 64, attention
read), here with --layers encoder and decoder layers; one batch of --sources random sources of exactly
|S| symbols, decoding forced to --target-len tokens; generation is also timed without its encoder
call, which does not depend on alignments. "source-wide reads" counts, over all calls of a
row (a warm-up and --repeats), the reads that returned weights over the source against all reads.
Seconds: medians over --repeats rounds in which the two rows of a call take turns.
"""

import argparse
import copy
import os
import statistics
import time

import torch

from recipes.speed.benchmark import copy_batches
from recipes.speed.transformer_decode import build


def count_source_wide_reads(model):
    """Wrap every decoder layer's read: counts[0] reads that returned source-wide weights, counts[1] all."""
    counts = [0, 0]
    for layer in model.decoder.layers:
        read = layer.encoder_attn
        forward = read.forward

        def counted(*args, _forward=forward, **kwargs):
            out, weights = _forward(*args, **kwargs)
            counts[0] += weights is not None
            counts[1] += 1
            return out, weights

        read.forward = counted
    return counts


def with_encoder_clock(model):
    """Make model.encoder.forward add its seconds to the returned one-element list."""
    encoder, spent = model.encoder.forward, [0.0]

    def timed_encoder(*args, **kwargs):
        start = time.perf_counter()
        out = encoder(*args, **kwargs)
        spent[0] += time.perf_counter() - start
        return out

    model.encoder.forward = timed_encoder
    return spent


def alternating(calls, repeats):
    """{label: (median seconds, median seconds outside the encoder)} of the zero-argument calls
    {label: (call, encoder clock or None)}, after one warm-up call each, taking turns for
    ``repeats`` rounds so that a changing machine load affects all alike."""
    seconds = {label: [] for label in calls}
    outside = {label: [] for label in calls}
    for round in range(repeats + 1):
        for label, (call, clock) in calls.items():
            if clock is not None:
                clock[0] = 0.0
            start = time.perf_counter()
            call()
            if round > 0:
                seconds[label].append(time.perf_counter() - start)
                outside[label].append(seconds[label][-1] - (clock[0] if clock is not None else 0.0))
    return {label: (statistics.median(seconds[label]), statistics.median(outside[label])) for label in calls}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source-len", type=int, default=2000)
    p.add_argument("--sources", type=int, default=8)
    p.add_argument("--target-len", type=int, default=50)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--layers", type=int, default=4, help="encoder and decoder layers")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    for name in ("source_len", "sources", "target_len", "beam", "layers", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment

    import fairseq_memattn

    arch = ["--arch", "transformer_memattn", "--memory-k", "64", "--memory-read", "attention"]
    length = max(args.source_len, args.target_len)
    model, task, _ = build(arch, length, layers=(args.layers, args.layers))
    batch = copy_batches(task, args.source_len - 1, args.sources, args.sources)[0]  # |S| with EOS
    src_tokens, src_lengths = batch["net_input"]["src_tokens"], batch["net_input"]["src_lengths"]
    prev = torch.randint(4, len(task.target_dictionary), (args.sources, args.target_len))
    print(f"plugin: {os.path.dirname(fairseq_memattn.__file__)}; {args.sources} sources of |S| = "
          f"{src_tokens.size(1)}, |T| = {args.target_len}, {args.layers} + {args.layers} layers, K = 64, "
          f"beam {args.beam}, median of {args.repeats} rounds, {torch.get_num_threads()} thread(s)\n")
    print("| call | alignments | seconds | seconds without the encoder | source-wide reads / reads |")
    print("| --- | --- | ---: | ---: | ---: |")
    model.encoder.alignment_request = None
    with torch.no_grad():
        # validation: eval mode without make_generation_fast_ (by default alignments are kept), or off
        validating, calls, counts = {}, {}, {}
        for label, request in (("default (eval mode)", None), ("off", False)):
            validating[label] = copy.deepcopy(model)
            validating[label].encoder.alignment_request = request
            encoder_out = validating[label].encoder(src_tokens, src_lengths)
            counts[label] = count_source_wide_reads(validating[label])
            calls[label] = (lambda m=validating[label], e=encoder_out: m.decoder(prev, e), None)
        for label, (seconds, _) in alternating(calls, args.repeats).items():
            print(f"| validation: decoder forward | {label} | {seconds:.4f} | {seconds:.4f} | "
                  f"{counts[label][0]} / {counts[label][1]} |")

        # fairseq-generate with --print-alignment (its make_generation_fast_, its generator), and without
        calls, counts = {}, {}
        for label, need_attn in (("--print-alignment", True), ("none", False)):
            generating = copy.deepcopy(model)
            generating.make_generation_fast_(need_attn=need_attn)
            kind = SequenceGeneratorWithAlignment if need_attn else SequenceGenerator
            generator = kind([generating], task.target_dictionary, beam_size=args.beam, max_len_a=0,
                             max_len_b=args.target_len, min_len=args.target_len)
            counts[label] = count_source_wide_reads(generating)
            calls[label] = (lambda g=generator, m=generating: g.generate([m], batch), with_encoder_clock(generating))
        for label, (seconds, decoding) in alternating(calls, args.repeats).items():
            print(f"| generation, beam {args.beam} | {label} | {seconds:.3f} | {decoding:.3f} | "
                  f"{counts[label][0]} / {counts[label][1]} |")

if __name__ == "__main__":
    main()
