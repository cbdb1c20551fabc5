#!/usr/bin/env python
"""Translating a file on several cores: one batch at a time on all of them (intra-op threads), or
several batches at once on one core each (CTranslate2's inter_threads, the export's workers):

    python -m recipes.speed.parallel --ct2 CT2_DIR [CT2_DIR ...] --export EXPORT [EXPORT ...] \\
        --input test.en [--cores 2] [--batch-size 16] [--beam 4] [--repeats 2] [--out parallel.md]

CT2_DIR: a fairseq `transformer` converted by ct2-fairseq-converter; EXPORT: a folder written by
fairseq-memattn-export (e.g. recipes.speed.deploy's Bible models, both with one dictionary).
--input: the sources as the models' pieces, one sentence per line (recipes.wmt17.run prepare's
bpe/test.SRC). Each engine translates the whole file in batches of --batch-size sentences, which
both sort by length, beam --beam, outputs of at most 200 tokens (fairseq's default), in three
settings: 1 thread; --cores threads on one batch; --cores batches at once, 1 thread each. Each
setting runs in its own process with OMP_NUM_THREADS set to its threads per batch; the time is the
median of --repeats translations of the file after a warm-up on one batch (model loading
excluded). Needs ctranslate2 and the optional extra deploy.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from fairseq_memattn.arg_types import positive_int
from recipes.cli import command_line, existing_file, folder_with, output_file
from recipes.speed.options import check_ct2_model, input_lines, load_export

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_LEN = 200


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ct2", nargs="*", type=folder_with("model.bin"), default=[], help="CTranslate2 model folders")
    p.add_argument("--export", nargs="*", default=[], help="fairseq-memattn-export folders")
    p.add_argument("--input", required=True, type=existing_file, help="the sources as pieces, one sentence per line")
    p.add_argument("--cores", type=positive_int, default=2)
    p.add_argument("--batch-size", type=positive_int, default=16)
    p.add_argument("--beam", type=positive_int, default=4)
    p.add_argument("--repeats", type=positive_int, default=2)
    p.add_argument("--out", type=output_file, help="write the markdown table here too")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # ENGINE:THREADS:WORKERS:FOLDER, run in a subprocess
    args = p.parse_args(argv)
    if args.worker:
        return args
    if not args.ct2 and not args.export:
        p.error("give at least one model folder (--ct2 or --export)")
    for folder in args.export:  # a broken one would fail only in its worker, after the others' timings
        load_export(p, folder)
    for folder in args.ct2:
        check_ct2_model(p, folder)
    input_lines(p, args.input)
    return args


def load(engine: str, folder: str, threads: int, workers: int, args):
    """A function translating all sources (lists of pieces) -> output tokens, EOS excluded."""
    if engine == "ct2":
        import ctranslate2

        translator = ctranslate2.Translator(folder, device="cpu", intra_threads=threads, inter_threads=workers)

        def run(sources):
            results = translator.translate_batch(sources, beam_size=args.beam, max_batch_size=args.batch_size,
                                                 max_decoding_length=MAX_LEN, max_input_length=0)
            return sum(len(r.hypotheses[0]) for r in results)
    else:
        from fairseq_memattn.deploy import Translator

        translator = Translator(folder, threads=threads)

        def run(sources):
            ids = [translator.src_dict.encode(" ".join(pieces)) for pieces in sources]
            hypotheses = translator.translate_ids(ids, batch_size=args.batch_size, workers=workers, beam=args.beam,
                                                  max_len_b=MAX_LEN)
            return sum(len(h[0]["tokens"]) - 1 for h in hypotheses)
    return run


def worker(args):
    engine, threads, workers, folder = args.worker.split(":", 3)
    with open(args.input, encoding="utf-8") as f:
        sources = [line.split() for line in f]
    run = load(engine, folder, int(threads), int(workers), args)
    run(sources[:args.batch_size])  # warm-up
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        tokens = run(sources)
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": statistics.median(times), "output_tokens": tokens, "sentences": len(sources)}))


def measure(engine: str, folder: str, threads: int, workers: int, argv) -> dict:
    passed = list(argv if argv is not None else sys.argv[1:])
    result = subprocess.run([sys.executable, os.path.abspath(__file__), *passed, "--worker",
                             f"{engine}:{threads}:{workers}:{folder}"], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": str(threads)})
    if result.returncode != 0:
        sys.exit(f"{engine} {folder} with {threads} thread(s) x {workers} failed (its error is above)")
    row = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"{engine} {folder} threads {threads} x {workers}: {row['seconds']:.2f} s", file=sys.stderr, flush=True)
    return row


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    settings = [(1, 1), (args.cores, 1), (1, args.cores)]
    lines = ["| engine | model | " + " | ".join(f"{t} thread(s) x {w} batch(es) at once" for t, w in settings) + " |",
             "|---|---|" + "---:|" * len(settings)]
    for engine, folders in (("ct2", args.ct2), ("export", args.export)):
        for folder in folders:
            rows = [measure(engine, folder, threads, workers, argv) for threads, workers in settings]
            cells = [f"{r['seconds']:.2f} s ({r['output_tokens']} tokens)" for r in rows]
            label = "CTranslate2" if engine == "ct2" else "exported (ONNX Runtime)"
            lines.append(f"| {label} | {os.path.basename(os.path.normpath(folder))} | " + " | ".join(cells) + " |")
    command = command_line("recipes.speed.parallel", argv)
    report = (f"# Translating a file on {args.cores} cores\n\nCommand: `{command}`\n\n"
              f"Seconds for the {rows[0]['sentences']} sentences of {args.input}, batches of {args.batch_size}, "
              f"beam {args.beam}:\n\n" + "\n".join(lines) + "\n")
    if args.out:
        pathlib.Path(args.out).write_text(report, encoding="utf-8")
    print(report)


if __name__ == "__main__":
    main()
