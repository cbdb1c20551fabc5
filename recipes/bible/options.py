"""The Bible recipes' command-line checks beyond recipes.cli's: argparse's one-line error, raised
before any work."""

import argparse

from recipes.cli import folder_with
from recipes.wmt17.data import DataError, check_pair


def prepared(*parts):
    """An argparse type: recipes.wmt17.run prepare's output folder, holding each of PARTS."""
    folder = folder_with(*parts)

    def parse(text):
        try:
            return folder(text)
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"{error} (recipes.wmt17.run prepare's output)")

    parse.__name__ = "folder"
    return parse


def language_pair(text):
    """An argparse type: two different language codes joined by '-', like en-fr."""
    try:
        check_pair(text)
    except DataError as error:
        raise argparse.ArgumentTypeError(str(error))
    return text
