"""Two exports of the same model timed against each other, interleaved in one process, so that the
machine's drift between runs falls on both alike: random sources of each length, every output
forced to that length, the median of --repeats translations of the whole batch by each.

    python -m experiments.export_ab.run BEFORE AFTER --threads 1 --lengths 10 20 30 50 --sources 64 --beam 4

Prints a markdown table: seconds of each export and AFTER's time over BEFORE's.
"""

import argparse
import time

import numpy as np

from fairseq_memattn.deploy.translator import Translator, default_session_options
from recipes.speed.profile_export import forced_batch


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", help="a folder written by fairseq-memattn-export")
    p.add_argument("after", help="another export of the same model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lengths", type=int, nargs="+", default=[10, 20, 30, 50])
    p.add_argument("--sources", type=int, default=64)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    translators = [Translator(folder, session_options=default_session_options(args.threads))
                   for folder in (args.before, args.after)]
    rng = np.random.default_rng(0)
    print(f"{args.sources} sources, beam {args.beam}, {args.threads} thread(s), median of {args.repeats}\n")
    print("| \\|S\\| = \\|T\\| | before | after | after / before |\n|---:|---:|---:|---:|")
    for length in args.lengths:
        src, options = forced_batch(translators[0], rng, args.sources, length, length, args.beam)
        seconds = [[], []]
        for translator in translators:
            translator.generate(src[:2], **options)  # warm-up
        for _ in range(args.repeats):
            for times, translator in zip(seconds, translators):
                start = time.perf_counter()
                translator.generate(src, **options)
                times.append(time.perf_counter() - start)
        before, after = (float(np.median(t)) for t in seconds)
        print(f"| {length} | {before:.3f} | {after:.3f} | {after / before:.2f} |", flush=True)


if __name__ == "__main__":
    main()
