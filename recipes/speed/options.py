"""What the speed recipes' command lines share: an export loaded (or refused on one line) before
any timing, and the settings measurements were made with, compared on reuse."""

import argparse

from recipes import cli


def load_export(p: argparse.ArgumentParser, folder: str, threads=None):
    """(Translator, TextCodec) of a folder written by fairseq-memattn-export; a missing or broken
    one, or a checkpoint given in its place, ends on p.error's one line."""
    from fairseq_memattn.cli.deploy_options import load

    return load(p, argparse.Namespace(model=folder, threads=threads, bpe=None, sentencepiece_model=None))


def changed(recorded: dict, current: dict) -> str:
    """recipes.cli.changed's "--beam 30 (now 4)" of the settings compared as text (a CSV holds its
    numbers as text); "" when none differs."""
    def as_text(settings):
        return {name: cli.option_value(value) for name, value in settings.items()}

    return cli.changed(as_text(recorded), as_text(current))
