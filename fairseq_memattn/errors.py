"""Errors a user can fix, and their one-line report on command lines.

The package raises ``UserError`` where it finds such an error (a bad option, a checkpoint
that does not fit or cannot be read, a source longer than the position encodings cover); its
message names the bad value and every fix, whichever command or program hit it. A user's own
program gets the exception as any other (it is a ``ValueError``).

Only command-line processes print it as one argparse-style line
(``fairseq-generate: error: ...``) in place of the traceback: our console scripts through
``one_line_errors``, fairseq's command lines through the ``sys.excepthook`` of
``install_hook``, which the plugin installs only when one of them (fairseq-hydra-train too) loads
it through ``--user-dir`` (``fairseq_command_line``). Every other exception keeps its traceback,
and so does ours with FAIRSEQ_MEMATTN_TRACEBACK=1.

This module imports neither torch nor fairseq, so the runtime without them can raise it too.
"""

import contextlib
import importlib
import importlib.util
import os
import sys
from typing import Optional

TRACEBACK_VARIABLE = "FAIRSEQ_MEMATTN_TRACEBACK"
# fairseq's Trainer.load_checkpoint re-raises whatever model.load_state_dict raised as this
_FAIRSEQ_RERAISE = "Cannot load model parameters from checkpoint"


class UserError(ValueError):
    """An error the user can fix: its message names the bad value and every fix, in one
    paragraph, whichever command or program hit it. A ValueError, so that callers that
    catch ValueError keep working. Command lines print it as one argparse-style line."""


def import_installed(module: str, missing: str, error=ImportError):
    """``module``, imported; where it is not installed, ``error(missing)`` (the advice to install
    it). An installed module that fails to import (a missing shared library, an import cut by
    Ctrl-C) raises its own error, which that advice would hide."""
    if importlib.util.find_spec(module) is None:
        raise error(missing)
    return importlib.import_module(module)


def program_name() -> str:
    """What argparse calls the program: fairseq-train, ... (python -m: the module's file)."""
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def fairseq_command_line() -> bool:
    """Whether this process is one of fairseq's command lines (fairseq-train, -generate, ...,
    or python -m fairseq_cli.X). The name the process was started by says it, before and
    after fairseq parsed its options; a user's program that imports fairseq is not one."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and (spec.name or "").startswith("fairseq_cli."):
        return True
    return program_name().startswith("fairseq-")


def reported_error(error: BaseException) -> Optional[UserError]:
    """The UserError an uncaught exception stands for: the exception itself, or ours that
    fairseq's Trainer re-raised with its own advice ("Cannot load model parameters ...;
    please ensure that the architectures match"). None for every other exception, so a
    user's error raised while handling ours keeps its traceback."""
    if isinstance(error, UserError):
        return error
    if type(error) is Exception and str(error).startswith(_FAIRSEQ_RERAISE) and not error.__suppress_context__:
        inner = error.__cause__ or error.__context__
        if isinstance(inner, UserError):
            return inner
    return None


def one_line(error: BaseException, prog: Optional[str] = None) -> str:
    """argparse's error line: "PROG: error: MESSAGE", the message on one line."""
    return f"{prog or program_name()}: error: {' '.join(str(error).split(chr(10)))}"


def install_hook() -> None:
    """A sys.excepthook that prints an uncaught UserError as one line (exit status 1) and
    leaves every other exception, KeyboardInterrupt included, to the previous hook."""
    previous = sys.excepthook
    if getattr(previous, "reports_user_errors", False):
        return

    def hook(kind, error, tb):
        ours = None if os.environ.get(TRACEBACK_VARIABLE) else reported_error(error)
        if ours is None:
            previous(kind, error, tb)
        else:
            print(one_line(ours), file=sys.stderr)

    hook.reports_user_errors = True
    sys.excepthook = hook
    # fairseq-hydra-train: Hydra prints every exception of the job under a trimmed traceback itself
    # and exits, unless HYDRA_FULL_ERROR is set; set, it re-raises, so that this hook sees ours
    # (other errors then keep their whole traceback).
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")


@contextlib.contextmanager
def one_line_errors(prog: str):
    """For a console script's main: a UserError raised inside ends the command as argparse
    does (one line, exit status 2); nothing else is touched."""
    try:
        yield
    except UserError as error:
        if os.environ.get(TRACEBACK_VARIABLE):
            raise
        print(one_line(error, prog), file=sys.stderr)
        raise SystemExit(2) from None
