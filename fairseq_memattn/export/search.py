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
breaks ties to the lower index, as a stable sort. fairseq sets NaN log-probabilities to -inf; a
row of LogSoftmax with a NaN is NaN or -inf throughout (a NaN or +inf logit, or all -inf, makes its
normalizer NaN), so the graph sets such rows to -inf whole, and tests for them on one sum per row.
"""

import numpy as np

from .graph import FLOAT, INT64, Graph


def beam_candidates(g: Graph, logits: str, vocab: int) -> None:
    edits = g.input("lprob_edits", FLOAT, ["edits", vocab])
    edit_rows = g.input("edit_rows", INT64, ["hypotheses"])
    scores = g.input("hypothesis_scores", FLOAT, ["hypotheses"])
    beam = g.input("beam", INT64, [1])
    k = g.input("candidates", INT64, [1])
    last = g.const([-1], np.int64)
    lprobs = g.op("LogSoftmax", logits, axis=-1)
    has_nan = g.op("IsNaN", g.op("ReduceSum", lprobs, last, keepdims=1))  # N x 1
    total = g.op("Add", g.op("Add", lprobs, g.op("Gather", edits, edit_rows, axis=0)), g.op("Unsqueeze", scores, last))
    total = g.op("Where", has_nan, g.const(-np.inf), total)
    width = g.op("Mul", beam, g.const([vocab], np.int64))
    per_source = g.op("Reshape", total, g.op("Concat", last, width, axis=0))
    values, indices = g.op("TopK", per_source, k, axis=-1, largest=1, sorted=1, outputs=2)
    g.output(values, "candidate_scores", FLOAT, ["sources", "candidates"])
    g.output(indices, "candidate_indices", INT64, ["sources", "candidates"])
