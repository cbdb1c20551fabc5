#!/usr/bin/env python
"""What --memory-position-window costs: transformer_memattn's encoder (fairseq's layers and the write
of the memory, once per source) with the window and without, the models of transformer_decode.py
(3 + 3 layers of 256 units, K = 64, attention read, untrained), one batch of random sources.

    OMP_NUM_THREADS=1 python -m experiments.window_cost.run --source-len 2000 --sources 20 --repeats 4

The window adds one K x |S| term to the write's scores; the decoder never sees it (it reads the same
K x d memory). The two models take turns, medians are reported.
"""

import argparse
import statistics
import time

import torch

from recipes.speed.transformer_decode import build


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source-len", type=int, default=2000)
    p.add_argument("--sources", type=int, default=20)
    p.add_argument("--repeats", type=int, default=4)
    args = p.parse_args(argv)
    for name in ("source_len", "sources", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    arch = ["--arch", "transformer_memattn", "--memory-k", "64", "--memory-read", "attention"]
    models = {flag: build([*arch, flag], args.source_len)[0]
              for flag in ("--no-memory-position-window", "--memory-position-window")}
    source = torch.randint(4, 20, (args.sources, args.source_len))
    lengths = torch.full((args.sources,), args.source_len)
    seconds = {flag: [] for flag in models}
    with torch.no_grad():
        for _ in range(args.repeats):
            for flag, model in models.items():
                start = time.perf_counter()
                model.encoder(source, src_lengths=lengths)
                seconds[flag].append(time.perf_counter() - start)
    print(f"encoder seconds, {args.sources} sources of |S| = {args.source_len}, "
          f"median of {args.repeats} (each round):")
    for flag, values in seconds.items():
        print(f"  {flag}: {statistics.median(values):.3f} ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
