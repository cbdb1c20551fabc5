"""fairseq-memattn-convert: a trained fairseq ``transformer`` into a ``transformer_memattn``."""

import argparse
import re
from typing import List, Optional

from . import log_to_stderr
from ..arg_types import path_given
from ..errors import one_line_errors

PROG = "fairseq-memattn-convert"
MEMORY_OPTION = re.compile(r"--(no-)?memory-[a-z-]+")
# Kept here, not cut from a docstring: help must not change with python -OO.
DESCRIPTION = """\
fairseq-memattn-convert: a trained fairseq transformer into a transformer_memattn.

    fairseq-memattn-convert CHECKPOINT OUT.pt --memory-k K [memory options] [--data DIR] [--force]

The two models share every weight but the write (Eq. 4-5): embeddings, positions, encoder
layers, decoder self-attention, feed-forward blocks, layer norms and output projection are
copied, and each decoder layer's encoder-attention becomes that layer's attention read of the
memory. The write is new; with the position window it starts at the encoder states nearest
each row's position (--write-start).

OUT keeps the checkpoint's update count, learning-rate schedule, data position and, for
fairseq's plain optimizers, the optimizer moments of the kept weights, so
"fairseq-train --restore-file OUT.pt" continues where the transformer stopped;
"--finetune-from-model OUT.pt" starts afresh.
"""


class MemoryOptions:
    """Stands for a parser in a model's ``add_args``: keeps its --memory-* options (their
    types, choices and help as fairseq-train has them) in ``group``, drops the others.
    Given options only end up in the namespace, so the architecture's defaults apply."""

    def __init__(self, group):
        self.group = group

    def add_argument(self, *names, **kwargs):
        if not MEMORY_OPTION.fullmatch(names[0]):
            return None
        kwargs["default"] = argparse.SUPPRESS
        if names[0] == "--memory-k":
            kwargs.update(required=True, help=kwargs.get("help", "") + " (required)")
        return self.group.add_argument(*names, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    import fairseq_memattn
    from fairseq.models import ARCH_MODEL_REGISTRY

    from ..convert import MEMATTN_ARCH, WRITE_STARTS

    fairseq_memattn.register()  # the architecture whose options are listed
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=False, description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a fairseq transformer checkpoint")
    parser.add_argument("out", type=path_given, help="where to write the transformer_memattn checkpoint")
    parser.add_argument("--data", help="the folder with the task's dictionaries, if not where the "
                                       "checkpoint was trained")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--write-start", choices=WRITE_STARTS,
                        help="how the write (Eq. 4-5) starts: nearest (the default with the position "
                             "window), W_alpha = 0 and each window half a row wide, so C_k is the encoder "
                             "state nearest relative position (k - 1/2)/K; model, as transformer_memattn "
                             "starts training from scratch (W_alpha random, windows a row wide)")
    group = parser.add_argument_group(
        f"memory options (those of fairseq-train --arch {MEMATTN_ARCH}; not given: the "
        "architecture's defaults)")
    ARCH_MODEL_REGISTRY[MEMATTN_ARCH].add_args(MemoryOptions(group))
    return parser


def main(argv: Optional[List[str]] = None) -> None:
    from ..convert import convert

    log_to_stderr("INFO")
    args = build_parser().parse_args(argv)
    options = {name: value for name, value in vars(args).items() if name.startswith("memory_")}
    with one_line_errors(PROG):
        convert(args.checkpoint, args.out, options, args.data, args.force, args.write_start)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
