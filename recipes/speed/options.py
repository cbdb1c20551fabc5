"""What the speed recipes share: an export loaded (or refused on one line) before any timing, the
settings measurements were made with, compared on reuse, an untrained model built as fairseq-train
builds it, and the bytes a decoder's state holds."""

import argparse
import itertools

from fairseq_memattn.errors import UserError, import_installed
from recipes import cli


def load_export(p: argparse.ArgumentParser, folder: str, threads=None):
    """(Translator, TextCodec) of a folder written by fairseq-memattn-export; a missing or broken
    one, or a checkpoint given in its place, ends on p.error's one line."""
    from fairseq_memattn.cli.deploy_options import load

    return load(p, argparse.Namespace(model=folder, threads=threads, bpe=None, sentencepiece_model=None))


def input_lines(p: argparse.ArgumentParser, path: str, limit: int = None) -> list:
    """--input's lines (the first LIMIT), or p.error's one line for a file that is not UTF-8 text or
    holds no sentence."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in itertools.islice(f, limit)]  # no further than LIMIT
    except UnicodeDecodeError as error:
        p.error(f"--input {path}: not UTF-8 text ({error})")
    if not any(line.strip() for line in lines):
        p.error(f"--input {path}: no sentences in it")
    return lines


def require(p: argparse.ArgumentParser, module: str, missing: str):
    """MODULE, imported; p.error's one line MISSING (how to install it) where it is not installed."""
    try:
        return import_installed(module, missing, UserError)
    except UserError as error:
        p.error(str(error))


def require_ctranslate2(p: argparse.ArgumentParser, needed_by: str, otherwise: str = ""):
    """The ctranslate2 module, or p.error's one line: NEEDED_BY (the options) need it, how to install
    it, and OTHERWISE (how to do without)."""
    return require(p, "ctranslate2", f"{needed_by} needs CTranslate2, which is not installed: "
                                     f"pip install ctranslate2{otherwise}")


def check_ct2_model(p: argparse.ArgumentParser, folder: str):
    """A CTranslate2 model folder loaded once, or refused on one line, before any timing."""
    ctranslate2 = require_ctranslate2(p, "--ct2")
    try:
        ctranslate2.Translator(folder, device="cpu")
    except (RuntimeError, ValueError) as error:
        p.error(f"argument --ct2: {folder}: CTranslate2 cannot load it ({error})")


def changed(recorded: dict, current: dict) -> str:
    """recipes.cli.changed's "--beam 30 (now 4)" of the settings compared as text (a CSV holds its
    numbers as text); "" when none differs."""
    def as_text(settings):
        return {name: cli.option_value(value) for name, value in settings.items()}

    return cli.changed(as_text(recorded), as_text(current))


def untrained_model(command):
    """(model, task, args): the model fairseq-train would build from COMMAND (its options), seed 0."""
    import torch
    from fairseq import options, tasks

    import fairseq_memattn

    fairseq_memattn.register()  # before fairseq parses --user-dir, so that it imports nothing
    args = options.parse_args_and_arch(options.get_training_parser(), command)
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    return task.build_model(args), task, args


def tensor_storages(value, storages=None) -> dict:
    """{data_ptr: bytes} of the storages of every tensor in VALUE (nested dicts, lists and tuples),
    added to STORAGES: a storage shared by several tensors counts once."""
    import torch

    storages = {} if storages is None else storages
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        storages.setdefault(storage.data_ptr(), storage.nbytes())
    elif isinstance(value, dict):
        for item in value.values():
            tensor_storages(item, storages)
    elif isinstance(value, (list, tuple)):
        for item in value:
            tensor_storages(item, storages)
    return storages
