"""Load fairseq checkpoints under torch's ``weights_only`` protection.

Since torch 2.6, ``torch.load`` refuses any global it does not know, and every
fairseq checkpoint stores its command line as an ``argparse.Namespace``, so
fairseq-generate fails with "Unsupported global: argparse.Namespace". Instead of
turning the protection off, we allowlist the plain-data types fairseq
checkpoints hold: the Namespace, and numpy scalars (validation metrics such as
BLEU can be saved as numpy floats). None of them runs code when unpickled, so a
checkpoint that tries to (a ``__reduce__`` payload) is still refused by torch.
"""

import argparse

import numpy as np
import torch

_NUMPY_SCALAR_TYPES = (np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_)


def fairseq_checkpoint_globals():
    """The types a fairseq checkpoint may pickle besides tensors and containers."""
    multiarray = getattr(np, "_core", None) or np.core  # numpy 2 renamed np.core
    return [
        argparse.Namespace,
        multiarray.multiarray.scalar,
        np.dtype,
        *(type(np.dtype(t)) for t in _NUMPY_SCALAR_TYPES),
    ]


def allow_fairseq_checkpoints():
    torch.serialization.add_safe_globals(fairseq_checkpoint_globals())
