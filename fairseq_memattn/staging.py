"""Outputs written beside their final path (a folder, or one file) and moved in once complete, so
that a refusal, a failure or an interruption leaves what was there before."""

import contextlib
import os
import shutil
import tempfile
from typing import Callable, Iterator, Type

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


def replace_atomically(path: str, write: Callable[[str], None]) -> None:
    """``write(partial)`` to a file beside ``path`` (the same folder, so that the rename is atomic,
    and the same extension, which some writers read the format from), then renamed to ``path``."""
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    partial = os.path.join(folder, f".{os.getpid()}.partial.{name}")
    try:
        write(partial)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.unlink(partial)
        raise
