"""Load fairseq checkpoints under torch's ``weights_only`` protection.

Since torch 2.6, ``torch.load`` refuses any global it does not know, and every
fairseq checkpoint stores its command line as an ``argparse.Namespace``, so
fairseq-generate fails with "Unsupported global: argparse.Namespace". Instead of
turning the protection off, we allowlist the plain-data types fairseq
checkpoints hold: the Namespace, numpy scalars (validation metrics such as
BLEU can be saved as numpy floats) and numeric numpy arrays (fairseq's
``--eval-bleu`` keeps its n-gram counts as arrays in the saved meters). None of
them runs code when unpickled, so a checkpoint that tries to (a ``__reduce__``
payload) is still refused by torch. Arrays of Python objects stay refused: only
the dtypes of numbers are allowlisted, so an object dtype cannot be rebuilt.

torch explains such a refusal with a long message whose advice is to allowlist
the offending global or to pass ``weights_only=False``, i.e. to let the file run
its code; a file that is no checkpoint at all gets the same refusal, and a
truncated checkpoint ends in an error from deep inside torch ("OSError: [Errno 22]
Invalid argument"). ``checkpoint_error_message`` says instead, in one paragraph,
what happened and what to do (``errors.py`` prints it in place of the traceback).
"""

import argparse
import os
import pickle
import re
import traceback
from typing import Optional

import numpy as np
import torch

_NUMPY_SCALAR_TYPES = (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                       np.uint8, np.uint16, np.uint32, np.uint64, np.bool_)


def fairseq_checkpoint_globals():
    """The types a fairseq checkpoint may pickle besides tensors and containers."""
    multiarray = (getattr(np, "_core", None) or np.core).multiarray  # numpy 2 renamed np.core
    return [
        argparse.Namespace,
        multiarray.scalar,
        # an array pickles as _reconstruct(ndarray, ...) and then sets its dtype and bytes;
        # numpy 1 wrote the module as numpy.core, numpy 2 as numpy._core
        (multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),
        (multiarray._reconstruct, "numpy._core.multiarray._reconstruct"),
        np.ndarray,
        np.dtype,
        *(type(np.dtype(t)) for t in _NUMPY_SCALAR_TYPES),
    ]


def allow_fairseq_checkpoints():
    torch.serialization.add_safe_globals(fairseq_checkpoint_globals())


class CheckpointError(ValueError):
    """A file that is not a readable fairseq checkpoint; the message names it."""


def read_checkpoint(path: str, data: Optional[str] = None) -> dict:
    """The state fairseq saved in ``path`` (its loader: args or cfg, old formats upgraded), with
    ``--data`` overridden when given; a one-line CheckpointError for a missing or unreadable file."""
    from fairseq import checkpoint_utils

    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides={"data": data} if data else None)
        state["cfg"]["model"]
    except Exception as error:
        if not looks_like_torch_save(path):
            raise CheckpointError(f"cannot read {path} as a fairseq checkpoint (not a file written by torch.save)")
        reason = str(error).splitlines()[0] if str(error) else ""
        raise CheckpointError(f"cannot read {path} as a fairseq checkpoint ({type(error).__name__}: {reason})")
    return state


def architecture(model_cfg) -> str:
    """The --arch a checkpoint's model config was trained with."""
    return getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None) or "?"


_REFUSED = "Weights only load failed"
SAFE_CONTENTS = "tensors, containers, argparse.Namespace, numpy scalars and numeric arrays"


def _torch_load_frame(tb):
    """The frame of torch.load the exception went through, if any."""
    for frame, _ in traceback.walk_tb(tb):
        if frame.f_code.co_name == "load" and frame.f_globals.get("__name__") == "torch.serialization":
            return frame
    return None


def looks_like_torch_save(path: str) -> bool:
    """Whether a file starts as torch.save writes: a zip archive, or (before torch 1.6, or
    with _use_new_zipfile_serialization=False) a pickle of protocol 2."""
    with open(path, "rb") as file:
        start = file.read(4)
    return start.startswith(b"PK\x03\x04") or start.startswith(b"\x80\x02")


def not_a_checkpoint(path: str, what: str) -> str:
    return (f"fairseq_memattn: {path} is not a fairseq checkpoint ({what}): give the .pt file "
            "fairseq-train saved (checkpoint_best.pt, checkpoint_last.pt, checkpointN.pt, ...)")


def loaded_non_checkpoint_message(tb) -> Optional[str]:
    """An error of fairseq reading what torch.load returned, when that is not the dict
    fairseq-train saves (e.g. a file of torch.save(tensor)); None otherwise."""
    for frame, _ in traceback.walk_tb(tb):
        if (frame.f_globals.get("__name__") == "fairseq.checkpoint_utils"
                and frame.f_code.co_name in ("load_checkpoint_to_cpu", "load_model_ensemble_and_task")
                and frame.f_locals.get("state") is not None):
            state = frame.f_locals["state"]
            if isinstance(state, dict) and "model" in state:
                return None
            path = frame.f_locals.get("path", frame.f_locals.get("filename", "the file"))
            kind = (f"a dict without 'model' (keys: {', '.join(map(str, list(state)[:5]))})"
                    if isinstance(state, dict) else f"a {type(state).__name__}")
            return not_a_checkpoint(path, f"torch.load gives {kind}, not the dict of a fairseq save")
    return None


def checkpoint_error_message(error: BaseException, tb) -> Optional[str]:
    """One paragraph for an error torch.load raised, or fairseq raised reading what it
    loaded; None for any other error."""
    frame = _torch_load_frame(tb)
    if frame is None:
        return loaded_non_checkpoint_message(tb)
    source = frame.f_locals.get("f")
    path = getattr(source, "name", source)
    path = os.fspath(path) if isinstance(path, (str, os.PathLike)) else "a checkpoint"
    if os.path.isfile(path) and not looks_like_torch_save(path):
        return not_a_checkpoint(path, "not a file torch.save writes: neither a zip archive nor a "
                                      "legacy torch pickle")
    if isinstance(error, pickle.UnpicklingError) and _REFUSED in str(error):
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        reason = (f"its pickle calls {found.group(1)}" if found
                  else "its pickle holds something other than plain data")
        return (
            f"fairseq_memattn: refused to load {path}: {reason}, which is not among the types "
            f"fairseq checkpoints hold ({SAFE_CONTENTS}). Unpickling it could run code from the "
            "file, so nothing in it was run. Load it with torch.load(..., weights_only=False) "
            "only if you trust where it came from."
        )
    # fairseq writes one file per save atomically, then copies it to the other
    # names (checkpoint_last.pt, checkpoint_best.pt) with a plain copy.
    return (
        f"fairseq_memattn: could not read {path} ({type(error).__name__}: {error}): the file is "
        "incomplete or not a torch checkpoint. A run killed while fairseq copied its checkpoint "
        "can leave checkpoint_last.pt cut short: resume from another checkpoint of the same save "
        "(checkpointN.pt or checkpoint_N_U.pt) with --restore-file."
    )
