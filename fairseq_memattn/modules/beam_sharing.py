"""Beam search without a copy per hypothesis: ``encoder_out`` (and what a
decoder derives from it once per source) holds one row per source, shared by
the ``group`` consecutive hypotheses of that source. Used by both models."""

from typing import Dict, List, Tuple

import torch
from torch import Tensor


def share_rows(new_order: Tensor, group: int) -> Tuple[Tensor, int]:
    """Where each hypothesis finds its source after beam search reorders them.

    Rows of ``encoder_out`` stand for blocks of ``group`` consecutive
    hypotheses (hypothesis j reads row j // group). After reordering by
    ``new_order`` hypothesis j reads old row ``new_order[j] // group``.
    fairseq's SequenceGenerator keeps each source's hypotheses in one block
    of ``beam`` rows, so these runs are all as long as the beam: the new rows
    are one per run, and ``encoder_out`` never holds a copy per hypothesis.
    Any other order falls back to one row per hypothesis (group 1).
    Returns (old rows to select, new group).
    """
    rows = new_order // group
    if rows.numel() == 0:
        return rows, 1
    runs, lengths = torch.unique_consecutive(rows, return_counts=True)
    if bool((lengths == lengths[0]).all()):
        return runs, int(lengths[0])
    return rows, 1


def select_rows(tensors: List[Tensor], new_order: Tensor, group: int) -> Tuple[List[Tensor], int]:
    """Reorder tensors holding one row per ``group`` hypotheses (see
    :func:`share_rows`); returns (tensors, new group). The usual beam step
    moves hypotheses only within their source's block and copies nothing.
    TorchScript-compatible, for the Transformer's typed ``encoder_out``."""
    rows, new_group = share_rows(new_order, group)
    if len(tensors) == 0:
        return tensors, new_group
    size = tensors[0].size(0)
    if rows.numel() == size and torch.equal(rows, torch.arange(size, device=rows.device)):
        return tensors, new_group
    return [t.index_select(0, rows) for t in tensors], new_group


def select_shared_rows(tensors: Dict[str, Tensor], new_order: Tensor, group: int):
    """:func:`select_rows` for a dict of tensors; returns (tensors, new group)."""
    names = list(tensors)
    selected, new_group = select_rows([tensors[name] for name in names], new_order, group)
    return dict(zip(names, selected)), new_group

