"""One-line reports of the errors a user can fix, for fairseq's command lines and ours.

fairseq's command lines end on an uncaught exception with its traceback, and for
some of this plugin's errors the last line is not ours at all: fairseq's Trainer
re-raises a checkpoint that does not fit as "Cannot load model parameters from
checkpoint ...; please ensure that the architectures match", and a source longer
than the position encodings' S is refused by fairseq's batching with advice about
--skip-invalid-size-inputs-valid-test only. The hook installed here prints, argparse
style (``fairseq-generate: error: ...``), one line for:

* a ``ValueError`` raised by this package (an option the model cannot honour, a
  checkpoint that does not fit), also when fairseq re-raised it as another error;
* an error of ``torch.load`` or of fairseq reading what it loaded (see
  ``checkpoint_safety.checkpoint_error_message``);
* fairseq's "Size of sample #N is invalid" when the source is longer than the
  S of Eq. 10 that the model's position encodings cover.

Every other exception keeps its traceback. Set FAIRSEQ_MEMATTN_TRACEBACK=1 to get
the traceback of these too.
"""

import os
import re
import sys
import traceback
from typing import Iterator, Optional

import torch

from .checkpoint_safety import checkpoint_error_message
from .models.memory_options import position_encoding_limit, source_too_long

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
TRACEBACK_VARIABLE = "FAIRSEQ_MEMATTN_TRACEBACK"
# fairseq's message; numpy 2 prints the sizes as np.int64(12)
_TOO_LONG = re.compile(r"^Size of sample #(\d+) is invalid \(=\(?(?:np\.\w+\()?(\d+)")


def program_name() -> str:
    """What argparse calls the program: fairseq-train, ... (python -m: the module's file)."""
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


def exception_chain(error: BaseException) -> Iterator[BaseException]:
    """The error, then what it was raised from or while handling, innermost last."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def raised_here(error: BaseException) -> bool:
    """Whether the error was raised by this package's own code (its innermost frame)."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(PACKAGE_DIR + os.sep)


def frame_locals(tb) -> Iterator[dict]:
    for frame, _ in traceback.walk_tb(tb):
        yield frame.f_locals


def source_too_long_message(error: BaseException) -> Optional[str]:
    """fairseq's "Size of sample #N is invalid" for a source longer than the position
    encodings' S, said with the option that sets S; None for any other error."""
    found = _TOO_LONG.match(str(error))
    if not found:
        return None
    # The models being run: fairseq-generate's and -interactive's ``models``, the hub's ``self.models``.
    models = []
    for variables in frame_locals(error.__traceback__):
        for candidate in (variables.get("models"), getattr(variables.get("self"), "models", None)):
            if isinstance(candidate, (list, tuple, torch.nn.ModuleList)):
                models += [m for m in candidate if isinstance(m, torch.nn.Module)]
    limits = [limit for limit in map(position_encoding_limit, models) if limit is not None]
    example, length = int(found.group(1)), int(found.group(2))
    if not limits or length <= min(limits):
        return None
    return (source_too_long(f"source #{example}", length, min(limits))
            + ", or skip such sources with --skip-invalid-size-inputs-valid-test")


def user_error_message(error: BaseException) -> Optional[str]:
    """The one line for an error a user can fix, or None to keep the traceback."""
    for link in exception_chain(error):
        message = checkpoint_error_message(link, link.__traceback__)
        if message is not None:
            return message
        if isinstance(link, ValueError) and raised_here(link):
            return f"{program_name()}: error: {link}"
        if isinstance(link, OSError) and str(link).startswith("Model file not found"):
            return f"{program_name()}: error: --path: {link}"  # fairseq's, for a missing checkpoint
        message = source_too_long_message(link)
        if message is not None:
            return f"{program_name()}: error: {message}"
    return None


def explain_errors():
    """Install a sys.excepthook that reports the errors of ``user_error_message`` in one
    line and leaves every other uncaught exception to the previous hook."""
    previous = sys.excepthook
    if getattr(previous, "explains_user_errors", False):
        return

    def hook(kind, error, tb):
        message = None if os.environ.get(TRACEBACK_VARIABLE) else user_error_message(error)
        if message is None:
            previous(kind, error, tb)
        else:
            print(" ".join(message.split("\n")), file=sys.stderr)

    hook.explains_user_errors = True
    sys.excepthook = hook
