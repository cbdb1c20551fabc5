#!/usr/bin/env python
"""First decoding-speed comparison (issue 14): transformer_memattn against fairseq's
`transformer` of the same size, long source and short output.

    OMP_NUM_THREADS=1 python recipes/speed/transformer_decode.py --source-len 800 --target-len 50

Untrained models (seed 0) as fairseq-train builds them, 3 + 3 layers of 256 units (4 heads,
FFN 1024), 20 symbols; fairseq's SequenceGenerator with beam 5 over one batch of --sources
random sources of exactly --source-len symbols, every output forced to --target-len tokens
(min_len = max_len), so all models decode the same number of steps. Encoder time is measured
apart (the encoder alone on the same batch); the decoder's ms per step is (total - encoder) /
steps. The models take turns; each reports the median of --repeats runs. Prints a table.
"""

import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.join(HERE, "..", "..", "fairseq_memattn")
sys.path.insert(0, HERE)
from benchmark import copy_batches  # noqa: E402

SIZES = ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
         "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
         "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "4"]
MODELS = {
    "transformer": ["--arch", "transformer"],
    "memattn K=64 attention": ["--arch", "transformer_memattn", "--memory-k", "64"],
    "memattn K=64 mix": ["--arch", "transformer_memattn", "--memory-k", "64", "--memory-read", "mix"],
}


def build(arch_args, source_len, target_len):
    from fairseq import options, tasks

    cmd = ["--user-dir", PLUGIN, "--task", "copy_task", "--copy-max-len", str(source_len), "--cpu",
           "--max-source-positions", str(source_len + 2),
           "--max-target-positions", str(max(source_len, target_len) + 2), *SIZES, *arch_args]
    args = options.parse_args_and_arch(options.get_training_parser(), cmd)
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    model = task.build_model(args)
    model.eval()
    # as fairseq-generate without --print-alignment: no alignments (in plain eval mode both
    # fairseq's Transformer and transformer_memattn would compute them)
    model.make_generation_fast_(need_attn=False)
    return model, task


def timed(fn):
    start = time.perf_counter()
    with torch.no_grad():
        fn()
    return time.perf_counter() - start


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source-len", type=int, default=800)
    p.add_argument("--target-len", type=int, default=50)
    p.add_argument("--sources", type=int, default=16)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    from fairseq.sequence_generator import SequenceGenerator

    runs = {}
    for name, arch_args in MODELS.items():
        model, task = build(arch_args, args.source_len, args.target_len)
        batch = copy_batches(task, args.source_len, args.sources, args.sources)[0]
        generator = SequenceGenerator([model], task.target_dictionary, beam_size=args.beam,
                                      max_len_a=0, max_len_b=args.target_len, min_len=args.target_len)
        runs[name] = (model, batch, generator)
    times = {name: {"total": [], "encoder": []} for name in MODELS}
    for _ in range(args.repeats):
        for name, (model, batch, generator) in runs.items():  # models take turns
            times[name]["encoder"].append(timed(lambda: model.encoder(**batch["net_input"])))
            times[name]["total"].append(timed(lambda: generator.generate([model], batch)))

    steps = args.target_len + 1
    base = statistics.median(times["transformer"]["total"])
    print(f"|S| = {args.source_len}, |T| = {args.target_len}, beam {args.beam}, {args.sources} sources, "
          f"{torch.get_num_threads()} thread(s), median of {args.repeats}")
    print("| model | total s | encoder s | decoder ms/step | speed-up vs transformer |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in MODELS:
        total = statistics.median(times[name]["total"])
        encoder = statistics.median(times[name]["encoder"])
        print(f"| {name} | {total:.2f} | {encoder:.2f} | {1000 * (total - encoder) / steps:.1f} | "
              f"{base / total:.2f}x |")


if __name__ == "__main__":
    main()
