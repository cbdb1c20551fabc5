"""Score fairseq-generate output as the paper did, plus exact-match accuracy
(the command line: ``fairseq-memattn-score``, in ``cli/score.py``).

BLEU is sacreBLEU with no tokenisation on the already tokenised hypotheses and
references (what Moses' multi-bleu.perl computes, which the paper used);
accuracy is the share of hypotheses equal to their reference, which says more
on a copy task. Empty references (length-0 copy examples) count like any other:
an empty hypothesis is then exactly right.

fairseq-interactive's and fairseq-memattn-translate's output has no references (T- lines):
give them as a file of one reference per input line; the hypotheses are then the D- lines,
the detokenized text the reference file holds.
"""

import sys
from typing import Dict, List, Optional, Tuple

from .errors import UserError, import_installed

NO_REFERENCES = ("no T- (reference) lines: fairseq-generate prints them; for the output of "
                 "fairseq-memattn-translate or fairseq-interactive give the references with "
                 "--reference FILE (one line per input line)")


def read_generate_output(lines, references: Optional[List[str]] = None) -> Tuple[List[str], List[str]]:
    """(hypotheses, references) in sample-id order: from T-/H- lines (fairseq-generate), or
    with ``references`` (one per input line, ids counting from 0) from D- lines."""
    refs: Dict[int, str] = {}
    hyps: Dict[int, str] = {}
    kept = "H" if references is None else "D"
    field = 2  # H-/D- lines: id, score, text
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        kind, _, sample_id = fields[0].partition("-")
        if kind == "T" and sample_id.isdigit():
            if int(sample_id) in refs:  # fairseq-generate prints one per sample: two runs' output
                raise UserError(f"T-{sample_id} appears twice: give the output of one fairseq-generate run")
            refs[int(sample_id)] = fields[1] if len(fields) > 1 else ""
        elif kind == kept and sample_id.isdigit() and int(sample_id) not in hyps:
            hyps[int(sample_id)] = fields[field] if len(fields) > field else ""  # best (first) hypothesis
    if references is not None:
        refs = dict(enumerate(references))
        beyond = sorted(set(hyps) - set(refs))
        if beyond:
            raise UserError(f"--reference has {len(refs)} lines but the output has hypotheses for "
                            f"line ids up to {beyond[-1]} (counted from 0): give one reference per input line")
    if not refs:
        raise UserError(NO_REFERENCES)
    missing = sorted(set(refs) - set(hyps))
    if missing:
        which = "D- (detokenized) hypothesis lines" if references is not None else "hypothesis"
        raise UserError(f"{len(missing)} references have no {which} (first id: {missing[0]})")
    ids = sorted(refs)
    return [hyps[i] for i in ids], [refs[i] for i in ids]


def score(hypotheses: List[str], references: List[str]) -> Dict[str, float]:
    sacrebleu = import_installed("sacrebleu", "BLEU needs sacrebleu, which is not installed: pip install "
                                              "'sacrebleu>=2.0'", UserError)
    bleu = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none")
    exact = sum(h.split() == r.split() for h, r in zip(hypotheses, references))
    return {
        "bleu": round(bleu.score, 2),
        "accuracy": round(100.0 * exact / len(references), 2),
        "sentences": len(references),
    }


def accuracy_by_length(hypotheses: List[str], references: List[str], width: int) -> List[Dict[str, object]]:
    """Exact-match accuracy per band of reference lengths (tokens, EOS not counted) of `width`:
    where a fixed-size memory runs out (it holds |S|/K tokens per context), accuracy falls
    with length. Also the hypotheses that hold their reference's tokens in another order
    ("reordered"): a memory that keeps which tokens a context holds but not their order.
    Bands with no reference are left out."""
    if width < 1:
        raise UserError(f"band width {width} (must be >= 1)")
    bands: Dict[int, List[int]] = {}
    for h, r in zip(hypotheses, references):
        hyp, ref = h.split(), r.split()
        band = bands.setdefault(len(ref) // width, [0, 0, 0])
        band[0] += hyp == ref
        band[1] += hyp != ref and sorted(hyp) == sorted(ref)
        band[2] += 1
    return [{"lengths": f"{b * width}-{(b + 1) * width - 1}", "exact": exact, "reordered": reordered,
             "sentences": n, "accuracy": round(100.0 * exact / n, 2)}
            for b, (exact, reordered, n) in sorted(bands.items())]


if __name__ == "__main__":  # the command line is in cli/; say where rather than do nothing
    print("python -m fairseq_memattn.score: error: run fairseq-memattn-score (or python -m fairseq_memattn.cli.score)",
          file=sys.stderr)
    sys.exit(2)
