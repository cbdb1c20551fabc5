"""The exported decoder's last part (fairseq_memattn/export/search.py): fairseq's log-probability
edits and BeamSearch.step's choice of candidates, run on ONNX Runtime, against a transcription
with loops over hypotheses and tokens, on scores with many ties, and logits with -inf, +inf, NaN
and rows of -inf only."""

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from fairseq_memattn.export.graph import FLOAT, Graph  # noqa: E402
from fairseq_memattn.export import search  # noqa: E402
from fairseq_memattn.export.search import beam_candidates  # noqa: E402

PAD, EOS, UNK = 1, 2, 3


def session(graph: Graph):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(graph.model().SerializeToString(), options, providers=["CPUExecutionProvider"])


def search_session(vocab: int):
    g = Graph("search")
    beam_candidates(g, g.input("logits", FLOAT, ["hypotheses", vocab]), vocab)
    return session(g)


def log_softmax(logits):
    g = Graph("log_softmax")
    g.output(g.op("LogSoftmax", g.input("logits", FLOAT, ["rows", "vocab"]), axis=-1), "lprobs", FLOAT,
             ["rows", "vocab"])
    return session(g).run(None, {"logits": logits})[0]


def transcription(lprobs, beam, step, min_len, eos_only, unk_penalty, scores, k):
    """fairseq's SequenceGenerator._generate before BeamSearch.step, then the step, with a full sort."""
    sources = len(lprobs) // beam
    chosen_scores, chosen = np.zeros((sources, k), np.float32), np.zeros((sources, k), np.int64)
    for source in range(sources):
        candidates = []
        for hypothesis in range(1 if step == 0 else beam):
            row = source * beam + hypothesis
            for token in range(lprobs.shape[1]):
                lp = lprobs[row, token]
                if np.isnan(lp) or token == PAD or (eos_only[row] and token != EOS) or \
                        (token == EOS and step < min_len):
                    lp = np.float32(-np.inf)
                if token == UNK:
                    lp = lp - np.float32(unk_penalty)
                total = lp if step == 0 else lp + scores[row]
                candidates.append((-total, hypothesis * lprobs.shape[1] + token))  # ties: lower index first
        for i, (negative, index) in enumerate(sorted(candidates)[:k]):
            chosen_scores[source, i], chosen[source, i] = -negative, index
    return chosen_scores, chosen


@pytest.mark.parametrize("largest_block", [128, 4])  # one block per hypothesis; several
@pytest.mark.parametrize("seed", range(4))
def test_candidates_equal_fairseqs_beam_step(seed, largest_block, monkeypatch):
    monkeypatch.setattr(search, "LARGEST_BLOCK", largest_block)
    rng = np.random.default_rng(seed)
    for _ in range(25):
        vocab, beam, sources = int(rng.integers(5, 40)), int(rng.integers(1, 5)), int(rng.integers(1, 4))
        n = sources * beam
        logits = rng.integers(-3, 3, size=(n, vocab)).astype(np.float32)  # many ties
        logits[rng.random(logits.shape) < 0.1] = -np.inf
        logits[rng.random(logits.shape) < 0.01] = np.nan
        logits[rng.random(logits.shape) < 0.01] = np.inf
        logits[rng.random(n) < 0.1] = -np.inf
        step, min_len = int(rng.integers(0, 4)), int(rng.integers(1, 4))
        unk_penalty = float(rng.choice([0.0, 0.7, -1.5]))
        eos_only = (rng.random(n) < 0.3) & (step >= min_len)  # --min-len <= the maximum length
        scores = rng.integers(-6, 0, size=n).astype(np.float32)
        k = min(2 * beam, (beam if step else 1) * vocab - 1)
        edits = np.zeros((2, vocab), np.float32)  # the translator's table, in another order
        edits[0] = -np.inf
        edits[0, EOS] = 0
        edits[1, PAD], edits[1, UNK] = -np.inf, -unk_penalty
        if step < min_len:
            edits[1, EOS] = -np.inf
        first = np.where(np.arange(n) % beam == 0, 0, -np.inf).astype(np.float32)
        got_scores, got = search_session(vocab).run(None, {
            "logits": logits, "lprob_edits": edits, "edit_rows": np.where(eos_only, 0, 1),
            "hypothesis_scores": scores if step else first,
            "beam": np.array([beam]), "candidates": np.array([k])})
        want_scores, want = transcription(log_softmax(logits), beam, step, min_len, eos_only, unk_penalty,
                                          scores, k)
        np.testing.assert_array_equal(got_scores, want_scores)
        np.testing.assert_array_equal(got, want)
