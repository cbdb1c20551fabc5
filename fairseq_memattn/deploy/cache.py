"""The Transformer decoder's self-attention cache, written in place by the decoder step."""

from typing import List

import numpy as np


class SelfAttentionCache:
    """Each decoder layer's self-attention keys and values of every position decoded so far
    (export/transformer._cached_self_attention), in tables of rows of D/H that ONNX Runtime reads
    and writes in place: the keys of position t of the hypothesis in row j are rows
    (t * rows + j) * H + h, h = 0 .. H - 1, written by the decoder step itself (its outputs are
    bound to them). Beam search reorders each hypothesis's list of slots t * rows + j, N x t
    integers, never the tables; the decoder graph gathers each hypothesis's N x t x D keys and
    values from them, per layer and step."""

    def __init__(self, layers: List[dict], rows: int, steps: int, ort_value):
        self.rows, self.heads = rows, layers[0]["heads"]  # fairseq's decoder layers have one head count
        self.tables, self.inputs = {}, {}  # by output name, by input name
        for index, layer in enumerate(layers):
            for part in ("key", "value"):
                table = np.empty((steps * rows * self.heads, layer["head_dim"]), np.float32)
                self.tables[f"new_{part}_{index}"] = table
                self.inputs[f"self_{part}_{index}"] = ort_value(table)  # the same memory
        self.slots = np.zeros((rows, steps), np.int64)
        self.addresses = {name: table.ctypes.data for name, table in self.tables.items()}

    def reorder(self, rows: np.ndarray) -> None:
        self.slots = self.slots[rows]

    def history(self, step: int) -> np.ndarray:
        """H x N x step: the table row of each head's key and value at each past position."""
        return self.slots[None, :, :step] * self.heads + np.arange(self.heads)[:, None, None]

    def bind_new_position(self, binding, step: int) -> None:
        """The step's new keys and values (N x H x D/H) are written to the rows of slots step * rows + j."""
        hypotheses = len(self.slots)
        first = step * self.rows * self.heads
        for name, table in self.tables.items():
            binding.bind_output(name, "cpu", 0, np.float32, [hypotheses, self.heads, table.shape[1]],
                                self.addresses[name] + first * table.strides[0])
        self.slots[:, step] = step * self.rows + np.arange(hypotheses)
