"""fairseq-memattn-translate: raw text in, fairseq-interactive's output out, on ONNX Runtime (help: DESCRIPTION)."""

import argparse
import itertools
import math
import os
import sys

from .deploy_options import (add_model_options, add_search_options, check_options, check_positive, check_range,
                             load, search_options)

PROG = "fairseq-memattn-translate"
BOM = b"\xef\xbb\xbf"
# Help text in a constant, not the docstring, so that it holds under python -OO.
DESCRIPTION = """raw text in, fairseq-interactive's output out, on ONNX Runtime.

    fairseq-memattn-translate FOLDER [--beam 5] [--nbest 1] [--buffer-size 1] [--max-tokens 1024] \\
        [--workers 1] [--print-alignment] [--plain] < input.txt
    # or: python -m fairseq_memattn.deploy FOLDER ...

Reads --buffer-size lines at a time, translates them and prints their S-/H-/D-/P- lines (A- with
--print-alignment) in input order, ids counting input lines from 0. Lines end in \\n, \\r\\n or \\r;
a UTF-8 byte order mark at the start is dropped. Each line is translated as if alone: its maximum
length counts its own tokens. A line the model cannot translate is reported on standard error with
its line number and skipped (with --plain an empty line stands in its place, so that output lines
match input lines); the exit status is then 1. sentencepiece is applied when FOLDER has
spm.model or with --bpe sentencepiece --sentencepiece-model PATH. With --workers W, W of a buffer's
batches decode at once (a buffer of fewer batches is cut so that each worker has one). Ctrl-C exits
with status 130, a closed standard output (| head) with 141, both without a traceback.
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(p)
    p.add_argument("--input", default="-", help="file to translate (default: standard input)")
    p.add_argument("--buffer-size", type=int, default=1,
                   help="lines read before translating them (default 1, as fairseq-interactive)")
    p.add_argument("--nbest", type=int, default=1)
    add_search_options(p)
    p.add_argument("--batch-size", type=int, help="sources per batch")
    p.add_argument("--print-alignment", action="store_true", help="print A- lines (beta alpha^T, hard)")
    p.add_argument("--plain", action="store_true", help="print only the best detokenized hypothesis per line")
    args = p.parse_args(argv)
    check_options(p, args)
    check_positive(p, args, "nbest", "batch_size")
    check_range(p, args, "buffer_size", 1, sys.maxsize)  # lines are read with itertools.islice
    if args.nbest > args.beam:
        p.error(f"invalid --nbest: {args.nbest} (must be <= --beam {args.beam})")
    if args.input != "-" and (not os.path.exists(args.input) or os.path.isdir(args.input)):  # a pipe will do
        p.error(f"--input: {'a folder' if os.path.isdir(args.input) else 'no such file'}: {args.input}")
    if (args.input == "-" and sys.stdin is None) or sys.stdout is None:
        p.error(f"standard {'output' if sys.stdout is None else 'input'} is closed")
    return p, args


def raw_lines(stream):
    """The byte lines of ``stream`` without their ends: \\n, \\r\\n or \\r (old Mac files), read as they
    come; a UTF-8 byte order mark at the start dropped (a BOM alone is an empty file)."""
    first = True
    while True:
        try:
            chunk = stream.readline()  # up to a \\n: a \\r\\n is never split between chunks
        except OSError as error:  # an unreadable --input, named
            raise OSError(error.errno, f"--input {getattr(stream, 'name', '-')}: {error.strerror}") from None
        if not chunk or (first and chunk == BOM):
            return
        if first:
            chunk, first = chunk[len(BOM):] if chunk.startswith(BOM) else chunk, False
        chunk = chunk[:-1] if chunk.endswith(b"\n") else chunk
        chunk = chunk[:-1] if chunk.endswith(b"\r") else chunk
        yield from chunk.split(b"\r")


def numbered_buffers(stream, size: int):
    """Lists of (line number from 1, text or None where it is not UTF-8), ``size`` lines each."""
    lines = enumerate(raw_lines(stream), start=1)
    while True:
        buffer = list(itertools.islice(lines, size))
        if not buffer:
            return
        yield [(number, decode_line(raw)) for number, raw in buffer]


def decode_line(raw: bytes):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def print_hypotheses(index: int, shown_source: str, hypotheses, codec, args) -> None:
    """fairseq-interactive's lines for one source; scores in base 2, as fairseq prints them: divided
    by ln 2 in float32, as fairseq divides its tensors."""
    import numpy as np

    ln2 = np.float32(math.log(2))
    if not args.plain:
        print(f"S-{index}\t{shown_source}")
    for hypothesis in hypotheses[: args.nbest]:
        pieces, text = codec.target(hypothesis["tokens"])
        if args.plain:
            print(text)
            return
        score = float(np.float32(hypothesis["score"]) / ln2)
        print(f"H-{index}\t{score}\t{pieces}")
        print(f"D-{index}\t{score}\t{text}")
        positional = np.asarray(hypothesis["positional_scores"], np.float32) / ln2
        print(f"P-{index}\t" + " ".join(f"{s:.4f}" for s in positional.tolist()))
        if args.print_alignment:
            print(f"A-{index}\t" + " ".join(f"{s}-{t}" for s, t in hypothesis["alignment"]))


def translate_buffer(buffer, translator, codec, args, options) -> int:
    """Translates and prints one buffer's lines; returns how many were skipped."""
    from ..deploy.exceptions import SourceError

    sources, skipped = {}, 0
    for number, line in buffer:
        try:
            if line is None:
                raise SourceError("not UTF-8 text")
            shown, ids = codec.source(line)
            translator.check_source(ids, max_tokens=args.max_tokens, min_len=options["min_len"],
                                    max_len_a=options["max_len_a"], max_len_b=options["max_len_b"])
        except SourceError as error:
            print(f"{PROG}: line {number}: {error}; skipped", file=sys.stderr, flush=True)
            skipped += 1
            continue
        sources[number] = shown, ids
    results = translator.translate_ids([ids for _, ids in sources.values()], max_tokens=args.max_tokens,
                                       batch_size=args.batch_size, workers=args.workers, beam=args.beam,
                                       alignment=args.print_alignment, **options)
    translated = {number: (shown, hypotheses) for (number, (shown, _)), hypotheses in zip(sources.items(), results)}
    for number, _ in buffer:
        if number in translated:
            print_hypotheses(number - 1, *translated[number], codec, args)
        elif args.plain:  # no line ids to tell which line is missing
            print()
    sys.stdout.flush()
    return skipped


def translate(argv=None) -> int:
    parser, args = parse_args(argv)
    # the words are UTF-8, as the input is read, whatever the locale (a text stream without an
    # encoding of its own, a program's StringIO, takes str as it is)
    encoding = getattr(sys.stdout, "encoding", None)
    if encoding and encoding.lower().replace("-", "") != "utf8" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(encoding="utf-8")
    translator, codec = load(parser, args)
    options = search_options(args)
    skipped = 0
    with sys.stdin.buffer if args.input == "-" else open(args.input, "rb") as stream:
        for buffer in numbered_buffers(stream, args.buffer_size):
            skipped += translate_buffer(buffer, translator, codec, args, options)
    if skipped:
        print(f"{PROG}: {skipped} line(s) skipped", file=sys.stderr)
    return 1 if skipped else 0


def main(argv=None) -> int:
    """translate(), with Ctrl-C (at start-up or while decoding: what was translated is printed)
    and a closed standard output (| head) ending quietly, as shell tools do."""
    try:
        return translate(argv)
    except KeyboardInterrupt:
        status = 130
    except BrokenPipeError:
        status = 141
    except OSError as error:  # a full disk, an unreadable --input
        print(f"{PROG}: error: {error}", file=sys.stderr)
        status = 1
    try:
        sys.stdout.flush()
    except OSError:
        pass
    # the reader may be gone: Python's own flush at exit must not print a BrokenPipeError
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return status


if __name__ == "__main__":
    sys.exit(main())
