"""What the speed recipes' command lines share: an export loaded (or refused on one line) before
any timing, and the settings measurements were made with, compared on reuse."""

import argparse


def load_export(p: argparse.ArgumentParser, folder: str, threads=None):
    """(Translator, TextCodec) of a folder written by fairseq-memattn-export; a missing or broken
    one, or a checkpoint given in its place, ends on p.error's one line."""
    from fairseq_memattn.cli.deploy_options import load

    return load(p, argparse.Namespace(model=folder, threads=threads, bpe=None, sentencepiece_model=None))


def changed(recorded: dict, current: dict) -> str:
    """The settings this run changes, as options ("--beam 30 (now 4)"); "" when none. A setting
    only one side has is not compared."""
    def shown(value):  # as text: a CSV holds its numbers as text
        return " ".join(map(str, value)) if isinstance(value, list) else str(value)

    return ", ".join(f"--{name.replace('_', '-')} {shown(recorded[name])} (now {shown(value)})"
                     for name, value in current.items() if name in recorded and shown(recorded[name]) != shown(value))
