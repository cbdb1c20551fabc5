"""fairseq-memattn-plot: attention figures of trained checkpoints (the paper's Figs. 6-8).

    fairseq-memattn-plot --user-dir fairseq_memattn --task copy_task --copy-max-len 20 \\
        --path ckpt/checkpoint_best.pt --gen-subset test --example-id 3 --min-len 0 \\
        --output attention.png
"""

import logging
import os
import sys
import warnings
from typing import List

import torch

from . import log_to_stderr
from ..arg_types import positive_int
from ..checkpoint_safety import NO_LANGUAGE_PAIR, no_language_pair, not_a_file
from ..errors import one_line_errors
from ..plot import (Alignment, PlotError, ReadChoice, check_has_attention, check_read_choice, check_task, decode,
                    describe, draw, save)
from ..plot.user_dir import accept_this_package
from ..search_settings import check_search_settings
from ..staging import file_in_the_way

logger = logging.getLogger("fairseq_memattn.plot")
PROG = "fairseq-memattn-plot"
MAX_DPI = 1200  # print quality; a figure of a few inches stays under a few hundred MB


def build_parser(prog=PROG):
    from fairseq import options

    parser = options.get_generation_parser(default_task="translation")
    parser.prog = prog
    group = parser.add_argument_group("Plot (fairseq-memattn-plot)")
    which = group.add_mutually_exclusive_group(required=True)
    which.add_argument("--example-id", type=int, metavar="N",
                       help="plot example N of --gen-subset (as in fairseq-generate's S-N lines)")
    which.add_argument("--sentence", metavar="TEXT",
                       help="plot this source sentence instead (tokenised and BPE-encoded like "
                            "fairseq-interactive does)")
    group.add_argument("--output", "-o", required=True, metavar="FILE",
                       help="image to write; its extension chooses the format (png, svg, pdf, ...)")
    group.add_argument("--labels", metavar="A,B,...",
                       help="column titles, one per --path checkpoint (default: from each model)")
    group.add_argument("--max-ticks", type=positive_int, default=40, metavar="N",
                       help="label at most N tokens per axis (every n-th beyond that)")
    group.add_argument("--layer", type=int, metavar="L",
                       help="transformer_memattn: the decoder layer whose read is plotted, 0-based "
                            "(default: the last, fairseq's alignment layer)")
    group.add_argument("--head", type=int, metavar="H",
                       help="transformer_memattn with the attention read: the head plotted, 0-based "
                            "(default: the mean over heads, as fairseq's alignments)")
    group.add_argument("--dpi", type=positive_int, default=150, metavar="N", help=f"1 to {MAX_DPI} (default 150)")
    return parser


def supported_formats():
    from matplotlib.figure import Figure

    return sorted(Figure().canvas.get_supported_filetypes())


def check_arguments(args, paths: List[str]) -> List[str]:
    """Everything that can be checked before loading a model; returns the column labels."""
    extension = os.path.splitext(args.output)[1].lstrip(".").lower()
    if extension not in supported_formats():
        raise PlotError(f"--output {args.output!r}: unknown image type {extension!r} "
                        f"(choose from {', '.join(supported_formats())})")
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise PlotError(f"--path: {'; '.join(str(not_a_file(p)) for p in missing)}")
    if os.path.isdir(args.output):
        raise PlotError(f"--output {args.output!r} is a folder: give the image's file name in it")
    blocked = file_in_the_way(os.path.dirname(os.path.abspath(args.output)))
    if blocked:
        raise PlotError(f"--output {args.output!r}: {blocked} is a file, not a folder")
    if args.dpi > MAX_DPI:  # matplotlib would allocate the whole raster: gigabytes, then a MemoryError or the OOM killer
        raise PlotError(f"invalid --dpi: {args.dpi} (must be <= {MAX_DPI})")
    check_search(args)
    if args.labels is None:
        return [None] * len(paths)
    labels = args.labels.split(",")
    if len(labels) != len(paths):
        raise PlotError(f"--labels gives {len(labels)} labels for {len(paths)} checkpoints "
                        f"in --path")
    return labels


def check_search(args) -> None:
    """fairseq's search options, which its beam search takes unchecked (``check_search_settings``),
    and those the plot cannot follow: it plots the search's own best hypothesis of the source alone."""
    check_search_settings(lambda name: getattr(args, name, None), lambda name: "--" + name.replace("_", "-"))
    unused = [flag for flag, given in (("--constraints", args.constraints), ("--score-reference", args.score_reference),
                                       ("--prefix-size", args.prefix_size)) if given]
    if unused:
        raise PlotError(f"{', '.join(unused)}: not taken by {PROG}, which plots the search's best hypothesis "
                        f"of the source alone")


def binarized_splits(folder: str, task_cfg) -> List[str]:
    """The splits fairseq-preprocess wrote into ``folder``, of the task's language pair where it
    has one."""
    source, target = getattr(task_cfg, "source_lang", None), getattr(task_cfg, "target_lang", None)
    pairs = {f"{source}-{target}", f"{target}-{source}"} if source and target else None
    names = [name.split(".") for name in os.listdir(folder) if name.endswith(".idx")]
    return sorted({parts[0] for parts in names if pairs is None or (len(parts) > 2 and parts[1] in pairs)})


def split_not_found(task_cfg, subset: str, error: FileNotFoundError) -> PlotError:
    """--gen-subset naming no split of the data folder, where fairseq says "Dataset not found:
    SPLIT (FOLDER)", an OSError without a file name."""
    from fairseq import utils

    folder = utils.split_paths(task_cfg.data)[0] if getattr(task_cfg, "data", None) else None
    splits = binarized_splits(folder, task_cfg) if folder else [subset]
    if subset in splits:  # there but unreadable, or a task without a data folder: the task's words
        return PlotError(f"--gen-subset {subset!r}: {error}")
    there = f"splits there: {', '.join(splits)}" if splits else "no binarized split there"
    return PlotError(f"--gen-subset {subset!r}: no such split in {folder} ({there})")


def load_sample(cfg, args, task):
    """A one-example batch: example --example-id of --gen-subset, or --sentence encoded."""
    if args.sentence is not None:
        tokenizer, bpe = task.build_tokenizer(cfg.tokenizer), task.build_bpe(cfg.bpe)
        text = args.sentence
        for encoder in (tokenizer, bpe):
            text = encoder.encode(text) if encoder is not None else text
        tokens = task.source_dictionary.encode_line(text, add_if_not_exist=False).long()
        if (tokens == task.source_dictionary.unk()).any():
            logger.warning("--sentence has tokens outside the source dictionary; shown as <unk>")
        dataset, index = task.build_dataset_for_inference([tokens], [tokens.numel()]), 0
    else:
        subset = cfg.dataset.gen_subset
        try:
            task.load_dataset(subset)
        except FileNotFoundError as error:
            if error.filename is not None:  # a file of the split: the general report names it
                raise
            raise split_not_found(cfg.task, subset, error) from None
        dataset, index = task.dataset(subset), args.example_id
        if not 0 <= index < len(dataset):
            raise PlotError(f"--example-id {index} is out of range for --gen-subset {subset!r}, "
                            f"which has examples 0..{len(dataset) - 1}")
    return dataset.collater([dataset[index]])


def run(args) -> List[Alignment]:
    """Load, check and decode every checkpoint; nothing is drawn before all of them worked."""
    import ast

    from fairseq import checkpoint_utils, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    with warnings.catch_warnings():  # hydra deprecation notices about fairseq's own configs
        warnings.simplefilter("ignore", UserWarning)
        cfg = convert_namespace_to_omegaconf(args)
    paths = utils.split_paths(cfg.common_eval.path) if cfg.common_eval.path else []
    if not paths:
        raise PlotError("--path: give the checkpoint(s) to plot")
    labels = check_arguments(args, paths)
    try:
        overrides = ast.literal_eval(cfg.common_eval.model_overrides)
    except (ValueError, SyntaxError):
        overrides = None
    if not isinstance(overrides, dict):
        raise PlotError(f"invalid --model-overrides: {cfg.common_eval.model_overrides!r} (must be a Python "
                        "dict, e.g. \"{'dropout': 0.0}\")")
    choice = ReadChoice(args.layer, args.head)
    use_cuda = torch.cuda.is_available() and not cfg.common.cpu
    try:
        task = tasks.setup_task(cfg.task)
    except Exception as error:  # fairseq's translation task raises a bare Exception for this one
        if str(error) != NO_LANGUAGE_PAIR:
            raise
        raise PlotError(no_language_pair(cfg.task.data, "pass --source-lang and --target-lang")) from None
    sample = load_sample(cfg, args, task)
    if use_cuda:
        sample = utils.move_to_cuda(sample)

    alignments = []
    for path, label in zip(paths, labels):
        models, saved_cfg = checkpoint_utils.load_model_ensemble([path], arg_overrides=overrides, task=task)
        model = models[0]
        check_task(cfg.task, task, getattr(saved_cfg, "task", None), path)
        check_has_attention(model, path)
        check_read_choice(model, path, choice)
        if use_cuda:
            model.cuda()
        model.make_generation_fast_(need_attn=True)  # what --print-alignment does
        arch = getattr(getattr(saved_cfg, "model", None), "arch", None)
        alignments.append(decode(model, task, cfg.generation, sample,
                                 label or describe(model, arch), choice))
    return alignments


def parse_args(argv=None, prog=PROG):
    """fairseq's own parsing: --user-dir, the task's and the generation options, and ours."""
    from fairseq import options

    import fairseq_memattn

    fairseq_memattn.register()
    accept_this_package()  # --user-dir naming any copy of this package imports nothing: this one serves
    return options.parse_args_and_arch(build_parser(prog), argv)


def main(argv=None, prog=PROG):
    log_to_stderr()
    args = parse_args(argv, prog)
    try:
        with one_line_errors(prog):
            alignments = run(args)
            try:
                save(draw(alignments, args.max_ticks), args.output, args.dpi)
            except OSError as error:
                raise PlotError(f"cannot write --output {args.output!r}: {error.strerror or error}") from None
    except OSError as error:  # a data directory or file of the task's options that is not there
        where = f"{error.filename}: " if error.filename else ""
        print(f"{prog}: error: {where}{error.strerror or error}", file=sys.stderr)
        sys.exit(2)
    for alignment in alignments:
        print(alignment.label)
        print(f"  S: {' '.join(alignment.source)}\n  H: {' '.join(alignment.target)}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
