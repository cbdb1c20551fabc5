"""argparse ``type=`` functions for numbers and paths: a bad value ends in argparse's one line,
naming the option and what it allows ("argument --memory-k: invalid value 0 (must be an integer >= 1)"),
before anything runs. Plain argparse: the models, the tools and the recipes share them."""

import argparse
import math


def integer_at_least(minimum: int):
    """An integer >= minimum."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r} (must be an integer >= {minimum})")
        if value < minimum:
            raise argparse.ArgumentTypeError(f"invalid value {value} (must be an integer >= {minimum})")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def number_above(minimum: float):
    """A finite number > minimum."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r} (must be a number > {minimum:g})")
        if not (math.isfinite(value) and value > minimum):
            raise argparse.ArgumentTypeError(f"invalid value {value:g} (must be a finite number > {minimum:g})")
        return value

    parse.__name__ = f"number > {minimum:g}"
    return parse


def probability_below_one(text: str) -> float:
    """A dropout probability: a number in [0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r} (must be a number in [0, 1))")
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"invalid value {value:g} (must be a number in [0, 1))")
    return value


def path_given(text: str) -> str:
    """A path to write: not empty, which names no file or folder."""
    if not text:
        raise argparse.ArgumentTypeError("invalid value '' (give a path)")
    return text


positive_int = integer_at_least(1)
non_negative_int = integer_at_least(0)
positive_number = number_above(0)
