"""Paths on the recipes' command lines, checked as argparse ``type=`` functions: a path that cannot
be what its option needs is refused in argparse's one line ("argument --data: DIR: no such folder")
before any work starts, so that nothing trains, decodes or is deleted first. Numbers:
fairseq_memattn.arg_types. And the one form of a refusal to reuse results made with other
settings: ``changed``'s "--beam 30 (now 4)". ``command_line``: the command a results file names."""

import argparse
import contextlib
import os
import pathlib
import shlex
import sys


def _missing_folders(path: str):
    """The folders of ``path`` (itself included) that do not exist, deepest first, and its first
    ancestor that does, as the system reads the path ("link/.." is the parent of where the link leads)."""
    missing, path = [], os.path.realpath(path)
    while not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing, path


def _broken_link(path: str):
    """The first of ``path``'s leading parts (itself included, as written) that is a link to
    nothing, or None: no folder can be made through it."""
    prefix = ""
    for part in pathlib.PurePath(path).parts:
        prefix = os.path.join(prefix, part)
        if os.path.islink(prefix) and not os.path.exists(prefix):
            return prefix
    return None


def _refuse_broken_link(text: str, path: str) -> None:
    link = _broken_link(path)
    if link:
        raise argparse.ArgumentTypeError(f"{text}: {link} is a link to {os.readlink(link)}, which does not exist")


def _file_on_the_way(path: str):
    """The first existing ancestor of ``path`` (itself included) that is not a folder, or None."""
    existing = _missing_folders(path)[1]
    return None if os.path.isdir(existing) else existing


def existing_file(text: str) -> str:
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"{text}: {'a folder, not a file' if os.path.isdir(text) else 'no such file'}")
    return text


def existing_dir(text: str) -> str:
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text}: {'a file, not a folder' if os.path.exists(text) else 'no such folder'}")
    return text


def folder_with(*parts: str):
    """An existing folder holding each of ``parts`` (relative paths), e.g. ``folder_with("data-bin")``."""
    def parse(text: str) -> str:
        existing_dir(text)
        missing = [part for part in parts if not os.path.exists(os.path.join(text, part))]
        if missing:
            raise argparse.ArgumentTypeError(f"{text}: no {', '.join(missing)} in it")
        return text

    parse.__name__ = "folder"
    return parse


def output_dir(text: str) -> str:
    """A folder to write into: one that exists, or a path where one can be made (tried, and the
    folders made for the try removed again: a folder is made by whoever writes into it, so that a
    refused command leaves none behind)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path (give a folder)")
    _refuse_broken_link(text, text)
    missing, existing = _missing_folders(text)
    if not os.path.isdir(existing):
        raise argparse.ArgumentTypeError(f"{text}: {existing} is a file, not a folder")
    made = []
    try:
        for folder in reversed(missing):
            try:
                os.mkdir(folder)
                made.append(folder)
            except FileExistsError:  # made meanwhile by a process beside this one (a driver's runs)
                if not os.path.isdir(folder):
                    raise
    except OSError as error:
        raise argparse.ArgumentTypeError(f"{text}: cannot make {error.filename} ({error.strerror})") from None
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):  # one beside it may be writing into it by now
                os.rmdir(folder)
    return text


def output_file(text: str) -> str:
    """A file to write at the end of the work: not a folder, and its folder is made now, so that
    the work is never lost to a missing folder."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text}: a folder (give the file's name)")
    _refuse_broken_link(text, os.path.dirname(text))
    folder = os.path.dirname(os.path.abspath(text))
    blocked = _file_on_the_way(folder)
    if blocked:
        raise argparse.ArgumentTypeError(f"{text}: {blocked} is a file, not a folder")
    os.makedirs(folder, exist_ok=True)
    return text


def duplicates(values):
    """The values given more than once, in the order first given."""
    return sorted({v for v in values if values.count(v) > 1}, key=values.index)


def refuse_duplicates(parser, args, *names):
    """PARSER's one line for a list option (args.NAME) that gives a value more than once: it would
    be measured, trained or reported twice."""
    for name in names:
        twice = duplicates(getattr(args, name) or [])
        if twice:
            parser.error(f"argument --{name.replace('_', '-')}: {', '.join(map(str, twice))} given more than once")


def check(parser, option, kind, value):
    """KIND(VALUE) for a type that depends on other options (the files of the chosen language
    pair, say), so it is applied after parsing; its refusal is PARSER's one line naming OPTION."""
    try:
        return kind(value)
    except argparse.ArgumentTypeError as error:
        parser.error(f"argument {option}: {error}")


def option_value(value) -> str:
    """VALUE as a command line gives it: a list's items space-separated, anything else as str()."""
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def changed(recorded: dict, current: dict, most=None) -> str:
    """The settings CURRENT changes from RECORDED (results made with them are not to be reused), as
    options in CURRENT's order, ", "-joined: "--beam 30 (now 4), --memory-k 4 (now 8)"; the first
    MOST of them and how many more where given; "" when none. Values are compared with ==, and a setting only one side
    has is not compared: each caller chooses what to compare by the dicts it gives."""
    differs = [f"--{name.replace('_', '-')} {option_value(recorded[name])} (now {option_value(value)})"
               for name, value in current.items() if name in recorded and recorded[name] != value]
    more = [f"{len(differs) - most} more"] if most is not None and len(differs) > most else []
    return ", ".join(differs[:most] + more)


def command_line(module: str, argv=None) -> str:
    """``python -m MODULE`` with this run's arguments (ARGV, default the process's), quoted so that it reruns."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])
