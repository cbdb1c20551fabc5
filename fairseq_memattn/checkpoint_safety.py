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
Invalid argument"). ``guard_fairseq_loading`` wraps fairseq's checkpoint loader so that
these end in a ``CheckpointError`` (one of our ``UserError``) that says, in one paragraph,
which file, what happened and what to do.
"""

import argparse
import functools
import os
import pickle
import re
from typing import Optional

import numpy as np
import torch

from .errors import UserError

_NUMPY_SCALAR_TYPES = (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
                       np.uint8, np.uint16, np.uint32, np.uint64, np.bool_)


def fairseq_checkpoint_globals():
    """The types a fairseq checkpoint may pickle besides tensors and containers."""
    multiarray = (getattr(np, "_core", None) or np.core).multiarray  # numpy 2 renamed np.core
    # a scalar pickles as scalar(dtype, bytes), an array as _reconstruct(ndarray, ...) and then its
    # dtype and bytes; numpy 1 wrote the module as numpy.core, numpy 2 as numpy._core
    by_both_names = [(function, f"{module}.multiarray.{function.__name__}")
                     for function in (multiarray.scalar, multiarray._reconstruct)
                     for module in ("numpy.core", "numpy._core")]
    return [
        argparse.Namespace,
        *by_both_names,
        np.ndarray,
        np.dtype,
        *(type(np.dtype(t)) for t in _NUMPY_SCALAR_TYPES),
    ]


def allow_fairseq_checkpoints():
    torch.serialization.add_safe_globals(fairseq_checkpoint_globals())


class CheckpointError(UserError):
    """A file that is not a readable fairseq checkpoint; the message names it."""


def not_a_file(path: str) -> CheckpointError:
    """The error for a checkpoint path that is not a file: missing, or a folder (its .pt files named)."""
    if not os.path.isdir(path):
        return CheckpointError(f"checkpoint not found: {path}")
    found = sorted(name for name in os.listdir(path) if name.endswith(".pt"))
    if not found:
        return CheckpointError(f"{path} is a folder with no .pt file: give a checkpoint file (checkpoint_best.pt, "
                               f"checkpoint_last.pt, ... in fairseq-train's --save-dir)")
    listed = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
    return CheckpointError(f"{path} is a folder: give a checkpoint file in it ({listed})")


def read_checkpoint(path: str, data: Optional[str] = None) -> dict:
    """The state fairseq saved in ``path`` (its loader: args or cfg, old formats upgraded), with
    ``--data`` overridden when given; a one-line CheckpointError for a missing or unreadable file."""
    from . import register

    register()  # our models, and fairseq's loader guarded
    from fairseq import checkpoint_utils

    if not os.path.isfile(path):
        raise not_a_file(path)
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides={"data": data} if data else None)
        state["cfg"]["model"]
    except CheckpointError:
        raise
    except Exception as error:
        reason = str(error).splitlines()[0] if str(error) else ""
        raise CheckpointError(f"cannot read {path} as a fairseq checkpoint ({type(error).__name__}: {reason})")
    return state


def architecture(model_cfg) -> str:
    """The --arch a checkpoint's model config was trained with."""
    return getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None) or "?"


def registered_model(model_cfg):
    """The model class fairseq has registered for a checkpoint's --arch (or model name); None if none."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    arch = architecture(model_cfg)
    return ARCH_MODEL_REGISTRY.get(arch) or MODEL_REGISTRY.get(arch)


# fairseq's translation task, given no source_lang / target_lang and a data folder without its binarized splits
NO_LANGUAGE_PAIR = "Could not infer language pair, please provide it explicitly"


def no_language_pair(data: str, fix: str) -> str:
    """fairseq's NO_LANGUAGE_PAIR said with the folder it looked in and the fix."""
    return f"{data} has no fairseq-preprocess output (train.SRC-TGT.SRC.idx) to tell the language pair from; {fix}"


def setup_task(task_cfg, path: str):
    """fairseq's task of the checkpoint ``path`` on its data folder (``task_cfg.data``), or a
    CheckpointError for a folder it cannot use: usually moved since training (an OSError or
    ValueError), or without the fairseq-preprocess output that tells the language pair (fairseq
    raises a bare Exception for that one)."""
    from fairseq import tasks

    try:
        return tasks.setup_task(task_cfg, from_checkpoint=True)
    except Exception as error:
        if str(error) == NO_LANGUAGE_PAIR:
            raise CheckpointError(f"cannot set up the task of {path}: " + no_language_pair(
                task_cfg.data, "pass --data DIR, the data-bin folder it was trained on")) from None
        if not isinstance(error, (OSError, ValueError)):
            raise
        raise CheckpointError(f"cannot set up the task of {path} on {task_cfg.data} ({type(error).__name__}: "
                              f"{error}); pass --data DIR, the folder with its dictionaries") from None


_REFUSED = "Weights only load failed"
SAFE_CONTENTS = "tensors, containers, argparse.Namespace, numpy scalars and numeric arrays"


def looks_like_torch_save(path: str) -> bool:
    """Whether a file starts as torch.save writes: a zip archive, or (before torch 1.6, or
    with _use_new_zipfile_serialization=False) a pickle of protocol 2."""
    with open(path, "rb") as file:
        start = file.read(4)
    return start.startswith(b"PK\x03\x04") or start.startswith(b"\x80\x02")


def not_a_checkpoint(path: str, what: str) -> str:
    return (f"{path} is not a fairseq checkpoint ({what}): give the .pt file "
            "fairseq-train saved (checkpoint_best.pt, checkpoint_last.pt, checkpointN.pt, ...)")


def is_fairseq_save(state) -> bool:
    return isinstance(state, dict) and "model" in state


def not_a_save(path: str, state) -> CheckpointError:
    """For a file that loads as something else than the dict fairseq-train saves."""
    kind = (f"a dict without 'model' (keys: {', '.join(map(str, list(state)[:5]))})"
            if isinstance(state, dict) else f"a {type(state).__name__}")
    return CheckpointError(not_a_checkpoint(path, f"torch.load gives {kind}, not the dict of a fairseq save"))


def checkpoint_error(path, error: BaseException) -> Optional[CheckpointError]:
    """The CheckpointError for an error fairseq's loader raised on ``path``, told from the
    file itself; None when the file is a readable fairseq checkpoint (the error is another's)."""
    path = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if path is None or not os.path.isfile(path):
        return None
    if not looks_like_torch_save(path):
        return CheckpointError(not_a_checkpoint(path, "not a file torch.save writes: neither a zip "
                                                      "archive nor a legacy torch pickle"))
    if isinstance(error, pickle.UnpicklingError) and _REFUSED in str(error):
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        reason = (f"its pickle calls {found.group(1)}" if found
                  else "its pickle holds something other than plain data")
        return CheckpointError(
            f"refused to load {path}: {reason}, which is not among the types fairseq checkpoints "
            f"hold ({SAFE_CONTENTS}). Unpickling it could run code from the file, so nothing in it "
            "was run. Load it with torch.load(..., weights_only=False) only if you trust where it "
            "came from.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        # fairseq writes one file per save atomically, then copies it to the other
        # names (checkpoint_last.pt, checkpoint_best.pt) with a plain copy.
        return CheckpointError(
            f"could not read {path} ({type(error).__name__}: {error}): the file is incomplete or "
            "not a torch checkpoint. A run killed while fairseq copied its checkpoint can leave "
            "checkpoint_last.pt cut short: resume from another checkpoint of the same save "
            "(checkpointN.pt or checkpoint_N_U.pt) with --restore-file.")
    return None if is_fairseq_save(state) else not_a_save(path, state)


def guard_fairseq_loading() -> None:
    """fairseq's checkpoint loader (fairseq-train --restore-file, -generate --path, the hub,
    ...) raises a CheckpointError naming the file for a file it cannot read or that is not
    a fairseq save, instead of torch's or fairseq's error from deep inside."""
    from fairseq import checkpoint_utils

    load = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(load, "guarded", False):
        return

    @functools.wraps(load)
    def guarded(path, *args, **kwargs):
        try:
            state = load(path, *args, **kwargs)
        except Exception as error:
            found = checkpoint_error(path, error)
            if found is None:
                raise
            raise found from error
        if not is_fairseq_save(state):
            raise not_a_save(path, state)
        return state

    guarded.guarded = True
    checkpoint_utils.load_checkpoint_to_cpu = guarded
