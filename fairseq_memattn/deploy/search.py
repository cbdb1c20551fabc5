"""fairseq's beam search (SequenceGenerator._generate with BeamSearch) over the candidates the
exported decoder step chooses (export/search.py ends the step in BeamSearch's choice of the 2 x
beam best): the hypotheses' tokens and scores, the finalisation of those ending in EOS, the removal
of finished sentences, the length penalty and --min-len / --max-len."""

from typing import Callable, List

import numpy as np

NEG_INF = np.float32(-np.inf)
# The edits of the log-probabilities set each of these first target symbols on its own and every
# other symbol of a row alike (export/search.py relies on it): fairseq's Dictionary puts <s>,
# <pad>, </s> and <unk> there.
EDITED_COLUMNS = 4


class Candidates:
    """One step's 2 x beam candidates per source: scores, hypothesis rows, tokens, and which end in EOS."""

    def __init__(self, scores: np.ndarray, indices: np.ndarray, vocab: int, beam: int, eos: int):
        self.scores = scores
        self.beams, self.tokens = np.divmod(indices, vocab)
        self.rows = self.beams + (np.arange(len(scores)) * beam)[:, None]
        self.eos = (self.tokens == eos) & (scores != NEG_INF)

    def keep(self, sources: np.ndarray, beam: int) -> None:
        """Only these sources' candidates, their hypothesis rows renumbered."""
        self.scores, self.beams, self.tokens, self.eos = (a[sources] for a in (self.scores, self.beams, self.tokens,
                                                                              self.eos))
        self.rows = self.beams + (np.arange(len(sources)) * beam)[:, None]


class BeamSearch:
    """The hypotheses of a batch of ``len(max_lens)`` sources, ``beam`` each; ``run(step)`` decodes
    them. ``max_lens``: each source's maximum output length; ``read_width``: record each step's
    read weights (K) for alignments."""

    def __init__(self, max_lens: np.ndarray, beam: int, vocab: int, eos: int, pad: int, unk: int, min_len: int = 1,
                 lenpen: float = 1.0, unk_penalty: float = 0.0, normalize_scores: bool = True, read_width: int = None):
        self.max_lens, self.beam, self.vocab, self.eos = max_lens, beam, vocab, eos
        self.min_len, self.lenpen, self.normalize_scores = min_len, lenpen, normalize_scores
        self.cand_size = 2 * beam
        self.max_len = int(max_lens.max())
        sources = len(max_lens)
        rows = sources * beam
        self.lprob_edits = edit_table(vocab, eos, pad, unk, unk_penalty)
        self.tokens = np.full((rows, self.max_len + 2), pad, np.int64)
        self.tokens[:, 0] = eos
        self.scores = np.zeros((rows, self.max_len + 1), np.float32)
        self.reads = np.zeros((rows, read_width, self.max_len + 2), np.float32) if read_width else None
        self.cands_to_ignore = np.zeros((sources, beam), bool)
        self.finalized: List[List[dict]] = [[] for _ in range(sources)]
        self.finished = [False] * sources
        self.sentence_ids = np.arange(sources)  # the original sentence of each row still decoded
        self.remaining = sources
        # the row of the previous step each row continues; the first step runs one row per source
        self.reorder = np.arange(sources)
        # export/search.py's "beam" and "candidates" at the first step and at every later one, the
        # same arrays from step to step (the decoder binds an input again only when it changes)
        self.size_inputs = [{"beam": np.array([rows], np.int64),
                             # BeamSearch.step's best 2 x beam (at step 0, of the first hypothesis's tokens)
                             "candidates": np.array([min(self.cand_size, rows * vocab - 1)], np.int64)}
                            for rows in (1, beam)]

    def run(self, decoder) -> List[List[dict]]:
        """Each source's hypotheses, best first. ``decoder``: DecoderRun's ``step(tokens, step,
        reorder, search inputs)`` and ``keep(sources, rows)``. A source's hypotheses start alike
        (fairseq chooses among its first one's tokens at step 0), so the first step decodes one
        row per source, whose state the decoder then gives each of its ``beam`` hypotheses."""
        for step in range(self.max_len + 1):
            rows = slice(None) if step else slice(None, None, self.beam)
            cand_scores, indices, read_weights = decoder.step(self.tokens[rows, step], step, self.reorder,
                                                              self.search_inputs(step))
            if self.reads is not None:
                self.reads[:, :, step + 1] = read_weights if step else np.repeat(read_weights, self.beam, axis=0)
            candidates = Candidates(cand_scores, indices, self.vocab, self.beam, self.eos)
            done = self.finalize_eos(step, candidates)
            if self.remaining == 0:
                break
            if done:
                self.drop(done, candidates, decoder.keep)
            self.advance(step, candidates)
        return [sorted(hypotheses, key=lambda h: -h["score"]) for hypotheses in self.finalized]

    def search_inputs(self, step: int) -> dict:
        """export/search.py's inputs for this step (at step 0, one row per source)."""
        rows_per_source = self.beam if step else 1
        at_max_len = np.repeat(self.max_lens[self.sentence_ids] <= step, rows_per_source)
        return {
            "lprob_edits": self.lprob_edits,
            "edit_rows": np.where(at_max_len, 2, int(step < self.min_len)),
            "hypothesis_scores": (np.ascontiguousarray(self.scores[:, step - 1]) if step
                                  else np.zeros(len(self.sentence_ids), np.float32)),
            **self.size_inputs[step > 0],
        }

    def finalize_eos(self, step: int, candidates: Candidates) -> List[int]:
        """The hypotheses ending in EOS among each source's first ``beam`` candidates are finalized;
        returns the rows of the sentences now finished."""
        beam = self.beam
        top_eos = candidates.eos[:, :beam]
        top_eos &= ~self.cands_to_ignore  # in candidates.eos, as fairseq masks its eos_mask
        if not top_eos.any():
            return []
        done = self.finalize(step, candidates.rows[:, :beam][top_eos], candidates.scores[:, :beam][top_eos])
        self.remaining -= len(done)
        return done

    def finalize(self, step: int, bbsz_idx: np.ndarray, eos_scores: np.ndarray) -> List[int]:
        """SequenceGenerator.finalize_hypos: the hypotheses ending in EOS at ``step``; returns the
        rows of the sentences that now have ``beam`` or reached their maximum length."""
        beam = self.beam
        tokens_clone = self.tokens[bbsz_idx, 1: step + 2].copy()
        tokens_clone[:, step] = self.eos
        pos_scores = self.scores[bbsz_idx, : step + 1].copy()
        pos_scores[:, step] = eos_scores
        pos_scores[:, 1:] = pos_scores[:, 1:] - pos_scores[:, :-1]
        if self.normalize_scores:
            eos_scores = eos_scores / (step + 1) ** self.lenpen
        unfin_idx = bbsz_idx // beam
        for i, row in enumerate(unfin_idx):
            sent = self.sentence_ids[row]
            if len(self.finalized[sent]) < beam:
                hypothesis = {"tokens": tokens_clone[i], "score": float(eos_scores[i]),
                              "positional_scores": pos_scores[i]}
                if self.reads is not None:
                    hypothesis["reads"] = self.reads[bbsz_idx[i], :, 1: step + 2].T.copy()  # T x K
                self.finalized[sent].append(hypothesis)
        newly_finished = []
        for row in np.unique(unfin_idx):
            sent = self.sentence_ids[row]
            if not self.finished[sent] and (len(self.finalized[sent]) == beam or step == self.max_lens[sent]):
                self.finished[sent] = True
                newly_finished.append(int(row))
        return newly_finished

    def drop(self, done: List[int], candidates: Candidates, keep: Callable) -> None:
        """Finished sentences leave the batch: their hypotheses, candidates and decoder rows."""
        beam = self.beam
        mask = np.ones(len(self.cands_to_ignore), bool)
        mask[done] = False
        batch_idxs = np.flatnonzero(mask)
        candidates.keep(batch_idxs, beam)
        self.cands_to_ignore = self.cands_to_ignore[batch_idxs]
        old_rows = (batch_idxs[:, None] * beam + np.arange(beam)).reshape(-1)
        self.tokens, self.scores = self.tokens[old_rows], self.scores[old_rows]
        if self.reads is not None:
            self.reads = self.reads[old_rows]
        self.sentence_ids = self.sentence_ids[batch_idxs]
        keep(batch_idxs, old_rows)

    def advance(self, step: int, candidates: Candidates) -> None:
        """The best ``beam`` candidates that do not end in EOS continue."""
        beam, cand_size = self.beam, self.cand_size
        eos_mask = candidates.eos
        eos_mask[:, :beam] = ~(~self.cands_to_ignore & ~eos_mask[:, :beam])
        active_mask = eos_mask.astype(np.int64) * cand_size + np.arange(eos_mask.shape[1])
        active_hypos = np.argsort(active_mask, axis=1, kind="stable")[:, :beam]
        # each chosen candidate's place in the sources x candidates arrays, read flat (cheaper
        # than take_along_axis on a few rows)
        chosen = (active_hypos + (np.arange(len(active_hypos)) * active_mask.shape[1])[:, None]).reshape(-1)
        self.cands_to_ignore = active_mask.reshape(-1)[chosen].reshape(-1, beam) >= cand_size
        active_bbsz_idx = candidates.rows.reshape(-1)[chosen]
        tokens, scores = self.tokens, self.scores
        tokens[:, : step + 1] = tokens[active_bbsz_idx, : step + 1]
        tokens[:, step + 1] = candidates.tokens.reshape(-1)[chosen]
        if step > 0:
            scores[:, :step] = scores[active_bbsz_idx, :step]
        scores[:, step] = candidates.scores.reshape(-1)[chosen]
        if self.reads is not None:
            self.reads[:, :, : step + 2] = self.reads[active_bbsz_idx, :, : step + 2]
        self.reorder = active_bbsz_idx


def edit_table(vocab: int, eos: int, pad: int, unk: int, unk_penalty: float) -> np.ndarray:
    """export/search.py's edits of the log-probabilities: after --min-len (row 0), before it (1),
    at the maximum length (2). From column EDITED_COLUMNS on, each row is one value."""
    lprob_edits = np.zeros((3, vocab), np.float32)
    lprob_edits[:2, pad] = NEG_INF
    lprob_edits[:2, unk] = -unk_penalty
    lprob_edits[1, eos] = NEG_INF
    lprob_edits[2] = NEG_INF
    lprob_edits[2, eos] = 0
    return lprob_edits
