"""The end of every exported decoder step: fairseq's edits of the log-probabilities and the
candidate choice of its BeamSearch.step, in the graph, so that the N x V log-probabilities never
leave ONNX Runtime.

Inputs, set by the translator each step (deploy/translator.py):

* ``lprob_edits`` (E x V) and ``edit_rows`` (N): what each hypothesis adds to its log-probabilities,
  row ``edit_rows[n]`` of the table: -inf at padding, -unkpen at <unk>, -inf at EOS before
  --min-len, and -inf at every token but EOS for a hypothesis at its maximum length;
* ``hypothesis_scores`` (N): each hypothesis's cumulative score, added to its row (at step 0, 0
  for a source's first hypothesis and -inf for the others: fairseq starts from the first alone);
* ``beam`` and ``candidates`` (1 each): hypotheses per source, and how many candidates to keep.

Outputs: ``candidate_scores`` and ``candidate_indices`` (sources x candidates), the best
(hypothesis, token) pairs of each source, best first, index = hypothesis x V + token. ONNX's TopK
breaks ties to the lower index, as a stable sort. fairseq sets NaN log-probabilities to -inf; so
does the graph, on the few values the choice below reads (a row of LogSoftmax with a NaN is NaN or
-inf throughout, so a block whose maximum is NaN hides no finite score).

The choice reads the N x V scores twice, not in a TopK over each source's beam x V: ONNX
Runtime's TopK takes about 2 ns a value, more than the rest of the step's search together. The
vocabulary is cut into blocks of ``block_size(V)`` entries; the ``candidates`` blocks of a source with
the largest maxima hold its ``candidates`` best scores (a score outside them has at least that many
block maxima, each a distinct score, at or above it), and a TopK over those blocks, kept in index
order so that ties still go to the lower index, is fairseq's choice.
"""

import numpy as np

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
    edited = g.op("Add", g.op("LogSoftmax", logits, axis=-1), g.op("Gather", edits, edit_rows, axis=0))
    # The best blocks of each source, in index order. A hypothesis's score is added to its blocks'
    # maxima and to the chosen blocks' entries only: max(a_i) + s is max(a_i + s) in floating point too.
    size = block_size(vocab)
    hypothesis_blocks = g.const([vocab // size], np.int64)
    source_width = g.op("Mul", beam, hypothesis_blocks)  # blocks per source
    per_source = g.op("Concat", last, source_width, g.const([size], np.int64), axis=0)
    blocks = g.op("Reshape", edited, per_source)  # sources x beam V/size x size
    source_scores = g.op("Reshape", scores, g.op("Concat", last, beam, axis=0))  # sources x beam
    maxima = g.op("Reshape", g.op("ReduceMax", blocks, axes=[-1], keepdims=0),
                  g.op("Concat", last, beam, hypothesis_blocks, axis=0))  # sources x beam x V/size
    maxima = g.op("Add", maxima, g.op("Unsqueeze", source_scores, last))
    maxima = without_nan(g, g.op("Reshape", maxima, g.op("Concat", last, source_width, axis=0)))
    k_blocks = g.op("Min", k, source_width)  # all of them where a source has fewer than k
    _, chosen = g.op("TopK", maxima, k_blocks, axis=-1, largest=1, sorted=1, outputs=2)
    chosen_in_order = g.op("Neg", g.op("TopK", g.op("Neg", chosen), k_blocks, axis=-1, largest=1, sorted=1,
                                       outputs=2)[0])
    # Their entries plus their hypothesis's score, and the best of those, as (hypothesis x V + token).
    picked = g.op("GatherElements", blocks, g.op("Expand", g.op("Unsqueeze", chosen_in_order, last),
                                                 g.op("Concat", g.op("Shape", chosen_in_order),
                                                      g.const([size], np.int64), axis=0)), axis=1)
    chosen_scores = g.op("GatherElements", source_scores, g.op("Div", chosen_in_order, hypothesis_blocks), axis=1)
    picked = g.op("Add", picked, g.op("Unsqueeze", chosen_scores, last))
    flat = without_nan(g, g.op("Reshape", picked, g.op("Concat", g.op("Shape", chosen_in_order, end=1), last, axis=0)))
    values, positions = g.op("TopK", flat, k, axis=-1, largest=1, sorted=1, outputs=2)
    block = g.op("GatherElements", chosen_in_order, g.op("Div", positions, g.const(size, np.int64)), axis=1)
    indices = g.op("Add", g.op("Mul", block, g.const(size, np.int64)), g.op("Mod", positions, g.const(size, np.int64)))
    g.output(values, "candidate_scores", FLOAT, ["sources", "candidates"])
    g.output(indices, "candidate_indices", INT64, ["sources", "candidates"])


def without_nan(g: Graph, values: str) -> str:
    """NaN made -inf, as fairseq does with its log-probabilities."""
    return g.op("Where", g.op("IsNaN", values), g.const(-np.inf), values)
