"""fairseq-memattn-convert: a trained fairseq ``transformer`` into a ``transformer_memattn``.

    fairseq-memattn-convert CHECKPOINT OUT.pt --memory-k K [memory options] [--data DIR] [--force]
"""

import argparse
import logging
import re
import sys
from typing import Dict, List, Optional

from .. import convert as library
from ..convert import MEMATTN_ARCH, ConvertError, convert

MEMORY_OPTION = re.compile(r"--(no-)?memory-[a-z-]+")


class RaisingParser(argparse.ArgumentParser):
    """An argparse parser whose errors are raised, for the caller's own one-line report."""

    def error(self, message):
        raise ConvertError(message)


def parse_memory_options(argv: List[str], prog: str) -> Dict[str, object]:
    """The ``--memory-*`` options given in ``argv``, parsed (and checked) by
    ``transformer_memattn``'s own command-line parser: {dest: value}."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    others = [a for a in argv if a.startswith("-") and not MEMORY_OPTION.fullmatch(a.split("=")[0])]
    if others:
        raise ConvertError(f"unrecognized arguments: {' '.join(others)} (only --memory-* options "
                           f"of {MEMATTN_ARCH} are taken)")
    # SUPPRESS: only the options given end up in the namespace
    parser = RaisingParser(prog=prog, argument_default=argparse.SUPPRESS, add_help=False)
    ARCH_MODEL_REGISTRY[MEMATTN_ARCH].add_args(parser)
    given = vars(parser.parse_args(argv))
    return {name: value for name, value in given.items() if name.startswith("memory_")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairseq-memattn-convert", allow_abbrev=False,
        description=__doc__ + "\n" + library.__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="memory options: those of fairseq-train --arch transformer_memattn (--memory-k, "
               "--memory-encoder-score, --memory-encoder-normalize, --[no-]memory-position-window, "
               "--[no-]memory-position-encoding, --memory-position-max-len, --memory-per-layer)")
    parser.add_argument("checkpoint", help="a fairseq transformer checkpoint")
    parser.add_argument("out", help="where to write the transformer_memattn checkpoint")
    parser.add_argument("--data", help="the folder with the task's dictionaries, if not where the "
                                       "checkpoint was trained")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    import fairseq_memattn  # noqa: F401  registers the models; allows fairseq checkpoints in torch.load

    logging.basicConfig(format="%(levelname)s | %(name)s | %(message)s", level=logging.INFO, stream=sys.stderr)
    parser = build_parser()
    args, memory_argv = parser.parse_known_args(argv)
    try:
        options = parse_memory_options(memory_argv, parser.prog)
        if "memory_k" not in options:
            raise ConvertError("the following arguments are required: --memory-k")
        convert(args.checkpoint, args.out, options, args.data, args.force)
    except ConvertError as error:
        parser.error(str(error))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
