"""The Sequence Copy task of the paper (Sec. 4.1, Table 1), as a fairseq task.

``--task copy_task`` makes its data in memory, no files needed: a vocabulary of
``--copy-vocab-size`` symbols ("0", "1", ...), each sequence's length drawn
uniformly from 0 to ``--copy-max-len`` (0 included), the target equal to the
source (or reversed with ``--copy-reverse``). Every split is a pure function of
``--copy-seed`` and the split's name, so fairseq-validate and fairseq-generate
see exactly the examples training saw, in any process. ``export_copy_data``
writes the same examples as parallel text for fairseq-preprocess
(``python -m fairseq_memattn.tasks.copy_task``, ``__main__.py``).

Decode with ``--min-len 0``: about 1 example in L+1 is empty, and fairseq's
default ``--min-len 1`` forbids the empty hypothesis (the task warns then).
"""

import inspect
import logging
import os
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch
from fairseq.data import Dictionary, LanguagePairDataset
from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.tasks import FairseqTask, register_task

from ...errors import UserError
from ...arg_types import integer_at_least

SPLITS = ("train", "valid", "test")
# Options of a training epoch that fairseq's Trainer.get_train_iterator alone passes to
# get_batch_iterator: they mark the iterator fairseq-train trains on (CopyTask.get_batch_iterator)
TRAINING_ONLY_OPTIONS = frozenset({"grouped_shuffling", "update_epoch_batch_itr"})
logger = logging.getLogger(__name__)


@dataclass
class CopyTaskOptions(FairseqDataclass):
    """The options argparse takes as fairseq generates them from a dataclass."""

    copy_reverse: bool = field(default=False, metadata={"help": "target is the reversed source"})
    max_source_positions: int = field(default=1024, metadata={"help": "max source length"})
    max_target_positions: int = field(default=1024, metadata={"help": "max target length"})


@dataclass
class CopyTaskConfig(CopyTaskOptions):
    """The task's config: the options above and the seed and sizes, whose ranges argparse
    checks (``add_copy_task_args``) and check_config repeats for a config built in Python."""

    copy_seed: int = field(default=1, metadata={"help": "seed of the data (not of training)"})
    copy_max_len: int = field(default=50, metadata={"help": "L: lengths are uniform in 0..L"})
    copy_vocab_size: int = field(default=20, metadata={"help": "number of symbols"})
    copy_train_size: int = field(default=100_000, metadata={"help": "training examples"})
    copy_valid_size: int = field(default=1_000, metadata={"help": "validation examples"})
    copy_test_size: int = field(default=1_000, metadata={"help": "test examples"})


MINIMUMS = {"copy_seed": 0, "copy_max_len": 0, "copy_vocab_size": 1, "copy_train_size": 1,
            "copy_valid_size": 1, "copy_test_size": 1}


def add_copy_task_args(parser) -> None:
    """The task's options, the seed and sizes with a type that refuses a value out of range
    (argparse's one-line error, before anything runs)."""
    gen_parser_from_dataclass(parser, CopyTaskOptions())
    for name, minimum in MINIMUMS.items():
        size = CopyTaskConfig.__dataclass_fields__[name]
        parser.add_argument("--" + name.replace("_", "-"), type=integer_at_least(minimum), default=size.default,
                            help=size.metadata["help"])


def check_config(cfg) -> None:
    problems = [f"--{name.replace('_', '-')}: {getattr(cfg, name)} (must be >= {minimum})"
                for name, minimum in MINIMUMS.items() if getattr(cfg, name) < minimum]
    if problems:
        raise UserError("invalid " + "; invalid ".join(problems))
    # The longest example, EOS included, must fit the positions (fairseq would drop it from
    # training and refuse it at validation)
    for side in ("source", "target"):
        limit = getattr(cfg, f"max_{side}_positions")
        if cfg.copy_max_len + 1 > limit:
            raise UserError(f"--copy-max-len {cfg.copy_max_len} makes examples of up to {cfg.copy_max_len + 1} "
                            f"tokens (EOS included), more than --max-{side}-positions {limit}: raise "
                            f"--max-{side}-positions or lower --copy-max-len")


def _draw_lengths(cfg, split: str):
    """The random generator of ``split`` and the source lengths it draws first."""
    if split not in SPLITS:
        raise UserError(f"copy_task has no split {split!r} (choose from {', '.join(SPLITS)})")
    rng = np.random.default_rng([cfg.copy_seed, SPLITS.index(split)])
    return rng, rng.integers(0, cfg.copy_max_len + 1, size=getattr(cfg, f"copy_{split}_size"))


def copy_examples(cfg, split: str) -> List[List[str]]:
    """The source sequences of ``split`` as lists of symbols (targets: the same, or reversed)."""
    rng, lengths = _draw_lengths(cfg, split)
    symbols = rng.integers(0, cfg.copy_vocab_size, size=int(lengths.sum()))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    return [[str(s) for s in symbols[a:b]] for a, b in zip(starts[:-1], starts[1:])]


def copy_target(cfg, source: List[str]) -> List[str]:
    return source[::-1] if cfg.copy_reverse else list(source)


def build_dictionary(vocab_size: int) -> Dictionary:
    dictionary = Dictionary()
    for symbol in range(vocab_size):
        dictionary.add_symbol(str(symbol))
    dictionary.finalize(padding_factor=1)
    return dictionary


@register_task("copy_task", dataclass=CopyTaskConfig)
class CopyTask(FairseqTask):
    """Sequence copy (or reverse) with generated data; see the module docstring."""

    def __init__(self, cfg: CopyTaskConfig, dictionary: Dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary

    @classmethod
    def add_args(cls, parser):
        add_copy_task_args(parser)

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        check_config(cfg)
        return cls(cfg, build_dictionary(cfg.copy_vocab_size))

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        sources = copy_examples(self.cfg, split)
        encode = lambda symbols: torch.LongTensor(  # noqa: E731
            [self.dictionary.index(s) for s in symbols] + [self.dictionary.eos()]
        )
        src = [encode(s) for s in sources]
        tgt = [encode(copy_target(self.cfg, s)) for s in sources]
        sizes = np.array([len(t) for t in src])
        self.datasets[split] = LanguagePairDataset(
            src, sizes, self.dictionary, tgt, sizes.copy(), self.dictionary,
            shuffle=split == "train",
        )

    def get_batch_iterator(self, dataset, *args, **kwargs):
        """fairseq's, with --required-batch-size-multiple kept for the iterator fairseq-train
        trains on alone. fairseq's batch_by_size drops a last batch whose size is not a
        multiple of it (8 by default): training loses those few examples, as fairseq's own
        tasks do, but validation, decoding and scoring of any split, the train split included,
        must see every example, so they get the multiple 1.

        The training request is the one that carries the options of a training epoch,
        ``grouped_shuffling`` and ``update_epoch_batch_itr``: fairseq's
        Trainer.get_train_iterator passes them, and no other caller in fairseq does (its
        get_valid_iterator, fairseq-generate, fairseq-validate, fairseq-interactive, the hub).
        A training split that the multiple leaves without a batch (all of it fits in one
        batch whose size is not a multiple) is refused in one line naming its size option and
        --required-batch-size-multiple; fairseq's translation task stops there too, with "The
        dataset is empty"."""
        call = inspect.signature(super().get_batch_iterator).bind(dataset, *args, **kwargs).arguments
        training = not TRAINING_ONLY_OPTIONS.isdisjoint(call)
        if not training:
            call["required_batch_size_multiple"] = 1
        iterator = super().get_batch_iterator(**call)
        if training and not iterator.frozen_batches:
            self._refuse_training_without_batches(call)
        return iterator

    def _refuse_training_without_batches(self, call) -> None:
        """The UserError for a training split that --required-batch-size-multiple leaves
        without a batch; nothing where fairseq's own message is the right one (every example
        too long for the model: "The dataset is empty ... skipped")."""
        multiple = call.get("required_batch_size_multiple", 1)
        if multiple <= 1:
            return
        dataset = call["dataset"]
        probe = super().get_batch_iterator(**{**call, "required_batch_size_multiple": 1,
                                               "disable_iterator_cache": True})
        kept = sum(len(batch) for batch in probe.frozen_batches)
        if not kept:
            return
        split = next((name for name, d in self.datasets.items() if d is dataset), None)
        size = len(dataset)
        given = f"--copy-{split}-size {size}" if split in SPLITS else f"a training set of {size} examples"
        fits = (f"its {size} examples fit in one batch" if kept == size else
                f"the {kept} of its {size} examples that fit the model's positions make one batch")
        fix = "pass --required-batch-size-multiple 1"
        if split in SPLITS and kept == size:
            fix += f", or a --copy-{split}-size that is a multiple of {multiple}"
        raise UserError(f"{given} leaves fairseq-train no batch to train on: {fits}, and fairseq drops a "
                        f"last batch whose size is not a multiple of --required-batch-size-multiple "
                        f"{multiple}: {fix}")

    def source_target_sizes(self, split):
        """Source and target sizes of ``split`` (EOS included), without making
        its examples: the model reads them for S of the position encodings."""
        sizes = _draw_lengths(self.cfg, split)[1] + 1
        return sizes, sizes

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None):
        return LanguagePairDataset(src_tokens, src_lengths, self.dictionary,
                                   tgt_dict=self.dictionary, constraints=constraints)

    def build_generator(self, models, args, *rest, **kwargs):
        """fairseq's generator; warns (and changes nothing) when ``--min-len`` forbids the
        empty output, which length-0 examples need: an explicit option stays the user's."""
        min_len = getattr(args, "min_len", 1)
        if min_len >= 1:
            logger.warning(
                f"--min-len {min_len} forbids the empty output, but length-0 copy examples "
                f"(about 1 in {self.cfg.copy_max_len + 1} at --copy-max-len {self.cfg.copy_max_len}) "
                "have an empty target, so they can never be decoded right: "
                "pass --min-len 0 to allow it (fairseq's default is 1)")
        return super().build_generator(models, args, *rest, **kwargs)

    def max_positions(self):
        return (self.cfg.max_source_positions, self.cfg.max_target_positions)

    def dictionary_advice(self, size: int) -> str:
        """How to build the dictionary of ``size`` symbols a checkpoint was trained with: it has no
        data directory, only fairseq's special symbols and --copy-vocab-size others."""
        return f"--copy-vocab-size {size - self.dictionary.nspecial}"

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary


def export_copy_data(cfg, out_dir: str, splits=SPLITS) -> None:
    """Write ``{split}.src`` / ``{split}.tgt`` (one example per line, length-0
    examples as empty lines) for the fairseq-preprocess route."""
    check_config(cfg)
    os.makedirs(out_dir, exist_ok=True)
    for split in splits:
        sources = copy_examples(cfg, split)
        for side, rows in (("src", sources), ("tgt", [copy_target(cfg, s) for s in sources])):
            with open(os.path.join(out_dir, f"{split}.{side}"), "w", encoding="utf-8") as f:
                f.writelines(" ".join(row) + "\n" for row in rows)
