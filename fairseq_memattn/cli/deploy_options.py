"""Command-line options shared by the translator and the server: the model, its text processing
and the search, range-checked at parse time; errors a user can fix end on one argparse line."""

import argparse
import math
import os


def add_model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a folder written by fairseq-memattn-export")
    p.add_argument("--bpe", choices=["sentencepiece"], help="default: sentencepiece if the folder has spm.model")
    p.add_argument("--sentencepiece-model", help="default: the folder's spm.model")
    p.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads per batch (1 to 4 x the cores)")
    p.add_argument("--workers", type=int, default=1,
                   help="batches decoded at once, each on --threads threads (default 1; with W workers "
                        "--threads defaults to the cores / W)")


def add_search_options(p: argparse.ArgumentParser) -> None:
    from ..deploy.batching import MAX_TOKENS  # numpy: not at import, so Ctrl-C at start-up reaches main

    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--unkpen", type=float, default=0.0)
    p.add_argument("--unnormalized", action="store_true", help="do not divide scores by length^lenpen")
    p.add_argument("--min-len", type=int, default=1)
    p.add_argument("--max-len-a", type=float, default=0.0, help="with --max-len-b: each output's maximum length "
                   "is a * (its source's tokens, EOS included) + b")
    p.add_argument("--max-len-b", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                   help=f"padded source tokens per batch (default {MAX_TOKENS}); a longer line is refused")


def check_range(p: argparse.ArgumentParser, args: argparse.Namespace, name: str, low=None, high=None) -> None:
    """args.<name> (where given) is a finite number within low..high (either may be None)."""
    value = getattr(args, name)
    if value is None:
        return
    flag = "--" + name.replace("_", "-")
    if isinstance(value, float) and not math.isfinite(value):  # an int of any size is finite
        p.error(f"invalid {flag}: {value} (must be a finite number)")
    if (low is not None and value < low) or (high is not None and value > high):
        allowed = f"between {low} and {high}" if low is not None and high is not None else \
            (f">= {low}" if low is not None else f"<= {high}")
        p.error(f"invalid {flag}: {value} (must be {allowed})")


def check_positive(p: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    for name in names:
        check_range(p, args, name, 1)


def check_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The translator's options, each refused in argparse's one line where out of range; and --threads,
    where not given, shared out among --workers."""
    check_positive(p, args, "beam", "max_tokens", "workers")
    check_range(p, args, "threads", 1, 4 * (os.cpu_count() or 1))  # more only oversubscribes the cores
    for name in ("min_len", "max_len_a", "max_len_b"):
        check_range(p, args, name, 0)
    # length^lenpen stays within float32 for any output length, and unkpen within what
    # log-probabilities add up to
    check_range(p, args, "lenpen", -10, 10)
    check_range(p, args, "unkpen", -10000, 10000)
    if args.threads is None and args.workers > 1:  # one batch per core group, not W batches on every core
        args.threads = max(1, (os.cpu_count() or 1) // args.workers)
    if args.sentencepiece_model and args.bpe != "sentencepiece":
        p.error("--sentencepiece-model needs --bpe sentencepiece")


def search_options(args: argparse.Namespace) -> dict:
    """Translator.generate's keyword arguments for the options add_search_options defines (beam aside)."""
    return dict(lenpen=args.lenpen, max_len_a=args.max_len_a, max_len_b=args.max_len_b, min_len=args.min_len,
                unk_penalty=args.unkpen, normalize_scores=not args.unnormalized)


def load(p: argparse.ArgumentParser, args: argparse.Namespace):
    """The translator and the text codec the options name; a model folder that is broken or whose
    parts do not fit together ends on one argparse line (status 2)."""
    from ..deploy.text import TextCodec
    from ..deploy.translator import Translator

    try:
        translator = Translator(args.model, threads=args.threads)
        spm = args.sentencepiece_model or (translator.sentencepiece_model if args.bpe in (None, "sentencepiece")
                                           else None)
        if args.bpe == "sentencepiece" and not spm:
            p.error(f"--bpe sentencepiece needs --sentencepiece-model (no spm.model in {args.model})")
        codec = TextCodec(translator.src_dict, translator.tgt_dict, spm)
    except (ValueError, ImportError, OSError) as error:
        p.error(str(error))
    return translator, codec
