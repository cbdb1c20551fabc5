"""The end of every exported decoder step: fairseq's edits of the log-probabilities and the
candidate choice of its BeamSearch.step, in the graph, so that the N x V log-probabilities never
leave ONNX Runtime.

Inputs, set by the translator each step (deploy/translator.py):

* ``lprob_edits`` (E x V) and ``edit_rows`` (N): what each hypothesis adds to its log-probabilities,
  row ``edit_rows[n]`` of the table: -inf at padding, -unkpen at <unk>, -inf at EOS before
  --min-len, and -inf at every token but EOS for a hypothesis at its maximum length. From column
  EDITED_COLUMNS on, a row holds one value (padding, <unk> and EOS are among the first symbols);
* ``hypothesis_scores`` (N): each hypothesis's cumulative score, added to its row (at step 0 the
  translator passes one row per source, scores 0, and beam 1: fairseq starts from the first alone);
* ``beam`` and ``candidates`` (1 each): hypotheses per source, and how many candidates to keep.

Outputs: ``candidate_scores`` and ``candidate_indices`` (sources x candidates), the best
(hypothesis, token) pairs of each source, best first, index = hypothesis x V + token. ONNX's TopK
breaks ties to the lower index, as a stable sort. fairseq sets NaN log-probabilities to -inf; so
does the graph, on the few values the choice below reads (a row of LogSoftmax with a NaN is NaN or
-inf throughout, so a block whose maximum is NaN hides no finite score).

The choice reads the N x V log-probabilities once, not in a TopK over each source's beam x V, which
would cost ONNX Runtime more than the rest of the step's search together. The
vocabulary is cut into blocks of ``block_size(V)`` entries; the ``candidates`` blocks of a source with
the largest maxima hold its ``candidates`` best scores (a score outside them has at least that many
block maxima, each a distinct score, at or above it), and a TopK over those blocks, kept in index
order so that ties still go to the lower index, is fairseq's choice.
"""

import numpy as np

from ..deploy.search import EDITED_COLUMNS
from .graph import FLOAT, INT64, Graph


LARGEST_BLOCK = 128


def block_size(vocab: int) -> int:
    """The largest divisor of V up to LARGEST_BLOCK (fairseq pads dictionaries to a multiple of 8)."""
    return max(d for d in range(1, min(LARGEST_BLOCK, vocab) + 1) if vocab % d == 0)


def beam_candidates(g: Graph, logits: str, vocab: int) -> None:
    edits = g.input("lprob_edits", FLOAT, ["edits", vocab])
    edit_rows = g.input("edit_rows", INT64, ["hypotheses"])
    scores = g.input("hypothesis_scores", FLOAT, ["hypotheses"])
    beam = g.input("beam", INT64, [1])
    k = g.input("candidates", INT64, [1])
    last = g.const([-1], np.int64)
    size = block_size(vocab)
    hypothesis_blocks = g.const([vocab // size], np.int64)
    lprobs = g.op("LogSoftmax", logits, axis=-1)
    maxima = block_maxima(g, lprobs, edits, edit_rows, vocab, size)  # N x V/size, edited
    # The best blocks of each source, in index order. A hypothesis's score is added to its blocks'
    # maxima and to the chosen blocks' entries only: max(a_i) + s is max(a_i + s) in floating point too.
    source_width = g.op("Mul", beam, hypothesis_blocks)  # blocks per source
    source_scores = g.op("Reshape", scores, g.op("Concat", last, beam, axis=0))  # sources x beam
    maxima = g.op("Reshape", maxima, g.op("Concat", last, beam, hypothesis_blocks, axis=0))  # sources x beam x V/size
    maxima = g.op("Add", maxima, g.op("Unsqueeze", source_scores, last))
    maxima = without_nan(g, g.op("Reshape", maxima, g.op("Concat", last, source_width, axis=0)))
    k_blocks = g.op("Min", k, source_width)  # all of them where a source has fewer than k
    _, chosen = g.op("TopK", maxima, k_blocks, axis=-1, largest=1, sorted=1, outputs=2)
    chosen_in_order = g.op("Neg", g.op("TopK", g.op("Neg", chosen), k_blocks, axis=-1, largest=1, sorted=1,
                                       outputs=2)[0])
    # Their entries, edited, plus their hypothesis's score, as fairseq sums them; the best of those,
    # as (hypothesis x V + token).
    per_source = g.op("Concat", last, source_width, g.const([size], np.int64), axis=0)
    picked = g.op("GatherElements", g.op("Reshape", lprobs, per_source),
                  g.op("Expand", g.op("Unsqueeze", chosen_in_order, last),
                       g.op("Concat", g.op("Shape", chosen_in_order), g.const([size], np.int64), axis=0)), axis=1)
    hypothesis = g.op("Div", chosen_in_order, hypothesis_blocks)  # within its source
    block = g.op("Mod", chosen_in_order, hypothesis_blocks)  # within its hypothesis
    source_edit_rows = g.op("Reshape", edit_rows, g.op("Concat", last, beam, axis=0))
    edit_block = g.op("Add", g.op("Mul", g.op("GatherElements", source_edit_rows, hypothesis, axis=1),
                                  hypothesis_blocks), block)
    edit_blocks = g.op("Reshape", edits, g.const([-1, size], np.int64))  # edits x V/size rows of blocks
    picked = g.op("Add", g.op("Add", picked, g.op("Gather", edit_blocks, edit_block, axis=0)),
                  g.op("Unsqueeze", g.op("GatherElements", source_scores, hypothesis, axis=1), last))
    flat = without_nan(g, g.op("Reshape", picked, g.op("Concat", g.op("Shape", chosen_in_order, end=1), last, axis=0)))
    values, positions = g.op("TopK", flat, k, axis=-1, largest=1, sorted=1, outputs=2)
    chosen_block = g.op("GatherElements", chosen_in_order, g.op("Div", positions, g.const(size, np.int64)), axis=1)
    indices = g.op("Add", g.op("Mul", chosen_block, g.const(size, np.int64)),
                   g.op("Mod", positions, g.const(size, np.int64)))
    g.output(values, "candidate_scores", FLOAT, ["sources", "candidates"])
    g.output(indices, "candidate_indices", INT64, ["sources", "candidates"])


def block_maxima(g: Graph, lprobs: str, edits: str, edit_rows: str, vocab: int, size: int) -> str:
    """Each hypothesis's block maxima of its edited log-probabilities (N x V/size), without
    editing all N x V of them: the first blocks, which hold the EDITED_COLUMNS symbols edited one
    by one, edited in full; every other block's maximum plus its row's one edit (max(a_i) + c is
    max(a_i + c) in floating point too)."""
    head = min(-(-EDITED_COLUMNS // size), vocab // size)  # blocks
    columns, axis = g.const([head * size], np.int64), g.const([1], np.int64)
    zero = g.const([0], np.int64)
    edited = g.op("Add", g.op("Slice", lprobs, zero, columns, axis),
                  g.op("Gather", g.op("Slice", edits, zero, columns, axis), edit_rows, axis=0))
    head_maxima = g.op("ReduceMax", g.op("Reshape", edited, g.const([0, head, size], np.int64)), axes=[-1], keepdims=0)
    if head * size == vocab:
        return head_maxima
    end = g.const([np.iinfo(np.int64).max], np.int64)
    rest_edit = g.op("Gather", g.op("ReduceMax", g.op("Slice", edits, columns, end, axis), axes=[1], keepdims=1),
                     edit_rows, axis=0)  # N x 1
    blocks = g.op("Reshape", lprobs, g.const([0, vocab // size, size], np.int64))  # N x V/size x size
    rest = g.op("Slice", g.op("ReduceMax", blocks, axes=[-1], keepdims=0), g.const([head], np.int64), end, axis)
    return g.op("Concat", head_maxima, g.op("Add", rest, rest_edit), axis=1)


def without_nan(g: Graph, values: str) -> str:
    """NaN made -inf, as fairseq does with its log-probabilities."""
    return g.op("Where", g.op("IsNaN", values), g.const(-np.inf), values)
