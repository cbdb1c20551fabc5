"""Outputs written in a folder beside their final path and moved in once complete, so that a
refusal or a failure leaves what was there before."""

import contextlib
import os
import shutil
import tempfile
from typing import Iterator, Type

from .errors import UserError


def file_in_the_way(path: str):
    """The first of ``path``'s folders that is a file, or None."""
    parts = os.path.abspath(path).split(os.sep)
    for end in range(2, len(parts) + 1):
        folder = os.sep.join(parts[:end])
        if os.path.exists(folder) and not os.path.isdir(folder):
            return folder
    return None


@contextlib.contextmanager
def staging_beside(out: str, error: Type[UserError] = UserError) -> Iterator[str]:
    """A new folder beside ``out`` (the same file system, so that its files move in by rename),
    removed afterwards; an ``out`` that cannot be written is ``error`` naming it, before any work."""
    parent = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(parent, exist_ok=True)
        folder = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out))}.", dir=parent)
    except OSError as reason:
        in_the_way = file_in_the_way(parent)
        why = f"{in_the_way} is a file, not a folder" if in_the_way else reason.strerror or reason
        raise error(f"invalid OUT: cannot write {out} ({why})") from None
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
