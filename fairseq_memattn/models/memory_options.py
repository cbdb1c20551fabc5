"""The command-line options of memory attention (Sec. 3) and S of Eq. 10 read
from the training data: shared by the LSTM and the Transformer models."""

import argparse
import logging
from typing import Optional, Tuple

import numpy as np
from fairseq import utils

from ..arg_types import positive_int
from ..errors import UserError
from ..plugin import note_position_limit
from ..modules.memory import ENCODER_NORMALIZATIONS, POSITION_NORMALIZATIONS, SCORE_FUNCTIONS, MemoryWrite

logger = logging.getLogger(__name__)


def add_memory_args(parser):
    """The options of memory attention (Sec. 3), shared by the LSTM and the
    Transformer models."""
    parser.add_argument("--memory-k", type=positive_int, metavar="K",
                        help="number of attention contexts K of memory attention")
    parser.add_argument("--memory-encoder-score", choices=SCORE_FUNCTIONS,
                        help="score of the write, Eq. 5: alpha = softmax or sigmoid of W_alpha s_t")
    parser.add_argument("--memory-decoder-score", choices=SCORE_FUNCTIONS,
                        help="score of the read, Eq. 7: beta = softmax or sigmoid of W_beta h_i")
    parser.add_argument("--memory-encoder-normalize", choices=ENCODER_NORMALIZATIONS,
                        help="axis of an encoder-side softmax: over the K contexts as in "
                             "Eq. 5 (contexts) or over source positions (time)")
    # --x and --no-x; SUPPRESS so that an architecture's own default applies when neither is given.
    parser.add_argument("--memory-position-encoding", action=argparse.BooleanOptionalAction,
                        default=argparse.SUPPRESS,
                        help="multiply Eq. 10 position encodings into the encoder scores (or not)")
    parser.add_argument("--memory-position-normalize", choices=POSITION_NORMALIZATIONS,
                        help="what each context's position encodings add up to over a sentence: 1, "
                             "as in Sec. 3.2 (sum), or the sentence's length, i.e. mean 1 (mean), which "
                             "keeps Eq. 9's product at the scale of W_alpha h (default: sum)")
    parser.add_argument("--memory-position-window", action=argparse.BooleanOptionalAction,
                        default=argparse.SUPPRESS,
                        help="add a learned soft window over the relative source position to each "
                             "context's write scores, context k starting around k/K of the sentence "
                             "(default: on for transformer_memattn's attention read, else off)")
    parser.add_argument("--memory-position-max-len", type=positive_int, metavar="S",
                        help="S of Eq. 10, the longest source (tokens, EOS included) the position "
                             "encodings cover; default: the longest source of the training data, "
                             "read when the model is built for training and kept in the checkpoint")


def memory_defaults(args, memory_k, position_encoding, encoder_normalize="contexts", position_window=False):
    """Defaults of the options add_memory_args adds, for an architecture."""
    args.memory_k = getattr(args, "memory_k", memory_k)
    args.memory_encoder_score = getattr(args, "memory_encoder_score", "softmax")
    args.memory_decoder_score = getattr(args, "memory_decoder_score", "softmax")
    args.memory_encoder_normalize = getattr(args, "memory_encoder_normalize", encoder_normalize)
    args.memory_position_encoding = getattr(args, "memory_position_encoding", position_encoding)
    args.memory_position_max_len = getattr(args, "memory_position_max_len", None)
    args.memory_position_normalize = getattr(args, "memory_position_normalize", "sum")
    args.memory_position_window = getattr(args, "memory_position_window", position_window)


def source_target_sizes(task, split: str) -> Tuple[np.ndarray, np.ndarray]:
    """Source and target sizes (EOS included, as fairseq counts them) of a
    split: from the task if it can tell them without making the examples (our
    copy_task), else from its dataset (fairseq's translation task and every task
    built on LanguagePairDataset: the binarized data's index, one pass per data
    shard)."""
    if hasattr(task, "source_target_sizes"):
        return task.source_target_sizes(split)
    if not hasattr(task, "load_dataset"):
        raise ValueError("it has no datasets")
    data = getattr(getattr(task, "cfg", None), "data", None)
    shards = len(utils.split_paths(data)) if data else 1
    sources, targets = [], []
    for epoch in range(1, shards + 1):
        task.load_dataset(split, epoch=epoch, combine=True)
        dataset = task.datasets.pop(split)  # fairseq-train loads it again, per epoch
        if getattr(dataset, "src_sizes", None) is None:
            raise ValueError(f"its {split!r} dataset ({type(dataset).__name__}) has no source sizes")
        sources.append(dataset.src_sizes)
        if getattr(dataset, "tgt_sizes", None) is not None:
            targets.append(dataset.tgt_sizes)
    return np.concatenate(sources), np.concatenate(targets) if targets else None


def fill_position_max_len(args, task) -> None:
    """With position encodings and no --memory-position-max-len, S is the
    training data's longest source, stored in args so that the checkpoint
    keeps the S the model was trained with."""
    if not args.memory_position_encoding and args.memory_position_max_len is not None:
        logger.warning(f"--memory-position-max-len {args.memory_position_max_len} is ignored: position "
                       f"encodings are off (add --memory-position-encoding to use them)")
    if not args.memory_position_encoding and args.memory_position_normalize != "sum":
        logger.warning(f"--memory-position-normalize {args.memory_position_normalize} is ignored: position "
                       f"encodings are off (add --memory-position-encoding to use them)")
    if args.memory_position_encoding and args.memory_position_max_len is None:
        args.memory_position_max_len = longest_training_source(args, task)
    if args.memory_position_encoding:  # fairseq's length checks then name the option
        note_position_limit(task, args.memory_position_max_len)


def longest_training_source(args, task) -> int:
    """S of Eq. 10 as the paper defines it: the longest source sequence of the
    training data, EOS included, among the pairs fairseq trains on (sources up
    to --max-source-positions, targets up to --max-target-positions).

    A fixed default would not do: with S much longer than the sentences
    (s << S) the first K-1 rows of Eq. 10 are nearly flat, a different model
    from the paper's. Where the training data cannot be read, stop and say
    what to pass.
    """
    split = getattr(args, "train_subset", "train")
    try:
        sources, targets = source_target_sizes(task, split)
        kept = sources <= args.max_source_positions
        if targets is not None:
            kept &= targets <= args.max_target_positions
        if not kept.any():
            raise ValueError(f"no pair of its {split!r} split fits --max-source-positions "
                             f"{args.max_source_positions} / --max-target-positions "
                             f"{args.max_target_positions}")
    except (FileNotFoundError, NotImplementedError, ValueError) as reason:
        raise UserError(
            f"--memory-position-encoding needs S of Eq. 10, the longest source the model trains "
            f"on, and it could not be read from the training data of task "
            f"{type(task).__name__} ({reason}): pass --memory-position-max-len S with the number "
            f"of tokens of your longest training source, EOS included (fairseq-preprocess's "
            f"binarized length), or --no-memory-position-encoding"
        ) from reason
    longest = int(sources[kept].max())
    logger.info(f"position encodings (Eq. 10): S = {longest}, the longest source of the {split!r} "
                f"split (EOS included); kept in the checkpoint as --memory-position-max-len {longest}")
    return longest


def position_encoding_limit(model) -> Optional[int]:
    """S of Eq. 10 that a model's position encodings cover (its longest source), or None
    when it has none."""
    limits = [module.position_encoding_max_len for module in model.modules()
              if isinstance(module, MemoryWrite) and module.position_encoding_max_len is not None]
    return min(limits) if limits else None


# fairseq's criterion whose loss reads the decoder's attention (net_output[1]["attn"]): guided alignment
ALIGNMENT_CRITERION = "label_smoothed_cross_entropy_with_alignment"


def trains_alignment(args, task) -> bool:
    """Whether training's loss reads the decoder's alignment. fairseq-train's options name the
    criterion; fairseq-hydra-train gives the model its own config alone, and there a task that loads
    alignments (--load-alignments, which only that criterion reads) says so."""
    criterion = getattr(args, "criterion", None)
    if criterion is not None:
        return criterion == ALIGNMENT_CRITERION
    return bool(getattr(getattr(task, "cfg", None), "load_alignments", False))


def check_alignment_distribution(args) -> None:
    """Guided alignment trains each target token's alignment (beta x alpha^T) as a distribution over
    the source: alpha's columns must sum to 1 over the source (softmax over time) and beta's rows
    over the K contexts (the mix read's weights are --memory-decoder-score's; the other reads' are
    always a softmax)."""
    checked = [("encoder-score", args.memory_encoder_score, "softmax"),
               ("encoder-normalize", args.memory_encoder_normalize, "time")]
    if args.memory_read == "mix":
        checked.append(("decoder-score", args.memory_decoder_score, "softmax"))
    wrong = " ".join(f"--memory-{option} {given}" for option, given, needed in checked if given != needed)
    if wrong:
        give = " ".join(f"--memory-{option} {needed}" for option, _, needed in checked)
        raise UserError(f"--criterion {ALIGNMENT_CRITERION} trains each target token's alignment (beta x alpha^T) "
                        f"as a distribution over the source, which with {wrong} it is not: give {give}")


def warn_ignored_decoder_score(args) -> None:
    """--memory-decoder-score is the score of Eq. 7, which only the mix read has: trained without it, said once."""
    if args.memory_read != "mix" and args.memory_decoder_score != "softmax":
        logger.warning(f"--memory-decoder-score {args.memory_decoder_score} ignored: --memory-read {args.memory_read} "
                       f"weighs the rows by a softmax of its scores (Eq. 2); the score of Eq. 7 is the mix's")


def check_all_embeddings_shared(args, task) -> None:
    """What --share-all-embeddings needs, said in one line (fairseq's transformer raises it deep
    inside build_model): one dictionary for both languages and one embedding size."""
    if not getattr(args, "share_all_embeddings", False):
        return
    if task.source_dictionary != task.target_dictionary:
        raise UserError(
            f"--share-all-embeddings needs one dictionary for both languages, but this data has "
            f"{len(task.source_dictionary)} source and {len(task.target_dictionary)} target symbols "
            f"in different dictionaries: preprocess with fairseq-preprocess --joined-dictionary, "
            f"or share only --share-decoder-input-output-embed")
    if args.encoder_embed_dim != args.decoder_embed_dim:
        raise UserError(
            f"--share-all-embeddings needs --encoder-embed-dim ({args.encoder_embed_dim}) equal to "
            f"--decoder-embed-dim ({args.decoder_embed_dim})")
