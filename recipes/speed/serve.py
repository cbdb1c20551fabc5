#!/usr/bin/env python
"""Throughput and latency of the translation server (fairseq_memattn.deploy.serve) against the
Translator decoding one sentence at a time:

    python -m recipes.speed.serve MODEL [--input raw.txt] [--sentences 200] [--clients 1 4 16] \\
        [--beam 5] [--threads 1] [--workers 1] [--batch-window-ms 5] [--out results/speed/serve.md]

MODEL is a folder written by fairseq-memattn-export. The sentences are --input's first lines,
or random strings of the source dictionary's symbols (--lengths tokens). "one at a time" calls
Translator.translate_ids on each sentence in turn, without HTTP; "batches of N" (N the most clients)
translates them all in one call, sorted by length into batches of N: about the most a server with N
clients can reach. Each server row has N clients, each posting one sentence per request and
waiting for its answer before the next, until all sentences are translated. The server runs in
this process (its event loop in a thread, the ONNX work in --workers threads of --threads each),
the clients in the main thread's event loop. Latency is a request's (or one sentence's) wall time;
throughput is sentences per second over the row. Needs the optional extras deploy and serve.
"""

import argparse
import asyncio
import time

import numpy as np

from fairseq_memattn.arg_types import non_negative_int, positive_int
from fairseq_memattn.cli.deploy_options import check_range
from recipes.cli import command_line, existing_file, output_file, refuse_duplicates
from recipes.speed.options import input_lines, load_export, require


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a folder written by fairseq-memattn-export")
    p.add_argument("--input", type=existing_file, help="raw text, one sentence per line (default: random symbols)")
    p.add_argument("--sentences", type=positive_int, default=200)
    p.add_argument("--lengths", type=positive_int, nargs=2, default=[5, 30], metavar=("MIN", "MAX"),
                   help="tokens of the random sentences")
    p.add_argument("--clients", type=positive_int, nargs="*", default=[1, 4, 16])
    p.add_argument("--beam", type=positive_int, default=5)
    p.add_argument("--max-len-a", type=float, default=1.2)
    p.add_argument("--max-len-b", type=non_negative_int, default=10)
    p.add_argument("--threads", type=positive_int, default=1, help="ONNX Runtime intra-op threads")
    p.add_argument("--workers", type=positive_int, default=1, help="the server's batches decoded at once")
    p.add_argument("--batch-window-ms", type=float, default=5.0)
    p.add_argument("--max-tokens", type=positive_int, default=1024)
    p.add_argument("--seed", type=non_negative_int, default=0)
    p.add_argument("--out", type=output_file, help="write the markdown table here too")
    return p


def sentences(p, args, codec) -> list:
    if args.input:
        return input_lines(p, args.input, args.sentences)
    rng = np.random.default_rng(args.seed)
    symbols = codec.src_dict.symbols[4:]  # fairseq's four special symbols first
    lines = [" ".join(rng.choice(symbols, rng.integers(args.lengths[0], args.lengths[1] + 1)))
             for _ in range(args.sentences)]
    return [codec.bpe.decode(line) for line in lines] if codec.bpe else lines


def one_at_a_time(translator, codec, lines, options) -> list:
    latencies = []
    for line in lines:
        start = time.perf_counter()
        translator.translate_ids([codec.source(line)[1]], **options)
        latencies.append(time.perf_counter() - start)
    return latencies


async def clients(url: str, lines: list, count: int, beam: int) -> list:
    """Per-request latencies of ``count`` clients sharing ``lines``, one request in flight each."""
    import aiohttp

    pending = iter(lines)
    latencies = []

    async def client(session):
        for line in pending:
            start = time.perf_counter()
            async with session.post(f"{url}/translate", json={"text": [line], "beam": beam}) as response:
                assert response.status == 200, await response.text()
                await response.json()
            latencies.append(time.perf_counter() - start)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(count)))
    return latencies


def row(label: str, latencies: list, seconds: float) -> str:
    p50, p95 = np.percentile(np.array(latencies) * 1000, [50, 95])
    return f"| {label} | {len(latencies) / seconds:.1f} | {p50:.1f} | {p95:.1f} |"


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    check_range(p, args, "max_len_a", 0)
    check_range(p, args, "batch_window_ms", 0)
    refuse_duplicates(p, args, "clients")
    if args.lengths[0] > args.lengths[1]:
        p.error(f"invalid --lengths: {args.lengths[0]} {args.lengths[1]} (MIN must be <= MAX)")
    require(p, "aiohttp", 'the server and its clients need aiohttp: pip install "aiohttp>=3.9"')
    from fairseq_memattn.deploy import SourceError
    from fairseq_memattn.deploy.serve import BackgroundServer, make_app

    translator, codec = load_export(p, args.model, args.threads)
    lines = sentences(p, args, codec)
    options = dict(beam=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    for number, line in enumerate(lines, start=1):  # the server would answer 413 or 400, failing a client
        try:
            translator.check_source(codec.source(line)[1], max_tokens=args.max_tokens, max_len_a=args.max_len_a,
                                    max_len_b=args.max_len_b)
        except SourceError as error:
            p.error(f"sentence {number}{f' of {args.input}' if args.input else ''}: {error}")
    translator.translate_ids([codec.source(lines[0])[1]], **options)  # warm-up
    table = [f"{len(lines)} sentences, beam {args.beam}, {args.threads} thread(s), the server's workers "
             f"{args.workers}, batching window "
             f"{args.batch_window_ms:g} ms, max tokens {args.max_tokens}", "",
             "| | sentences/s | p50 ms | p95 ms |", "|---|---:|---:|---:|"]
    start = time.perf_counter()
    latencies = one_at_a_time(translator, codec, lines, options)
    table.append(row("Translator, one at a time", latencies, time.perf_counter() - start))
    batch = max(args.clients, default=1)  # the engine's own batched throughput: what bounds the server's
    sources = [codec.source(line)[1] for line in lines]
    start = time.perf_counter()
    translator.translate_ids(sources, max_tokens=args.max_tokens, batch_size=batch, **options)
    table.append(f"| Translator, batches of {batch} sorted by length | {len(lines) / (time.perf_counter() - start):.1f}"
                 f" | | |")
    search = dict(lenpen=1.0, max_len_a=args.max_len_a, max_len_b=args.max_len_b, min_len=1, unk_penalty=0.0,
                  normalize_scores=True)
    app = make_app(translator, codec, search, beam=args.beam, window=args.batch_window_ms / 1000,
                   max_tokens=args.max_tokens, queue_size=max(args.clients, default=1) * 2, workers=args.workers,
                   max_beam=args.beam)
    with BackgroundServer(app) as server:
        for count in args.clients:
            start = time.perf_counter()
            latencies = asyncio.run(clients(server.url, lines, count, args.beam))
            table.append(row(f"server, {count} client(s)", latencies, time.perf_counter() - start))
    print("\n".join(table))
    if args.out:
        command = command_line("recipes.speed.serve", argv)
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(f"# The translation server\n\nCommand: `{command}`\n\n" + "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
