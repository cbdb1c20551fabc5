"""Score fairseq-generate output as the paper did, plus exact-match accuracy
(``fairseq-memattn-score``, ``fairseq_memattn.cli.score``).

BLEU is sacreBLEU with no tokenisation on the already tokenised hypotheses and
references (what Moses' multi-bleu.perl computes, which the paper used);
accuracy is the share of hypotheses equal to their reference, which says more
on a copy task. Empty references (length-0 copy examples) count like any other:
an empty hypothesis is then exactly right.
"""

from typing import Dict, List, Tuple

import sacrebleu


def read_generate_output(lines) -> Tuple[List[str], List[str]]:
    """(hypotheses, references) in sample-id order from T-/H- lines."""
    refs: Dict[int, str] = {}
    hyps: Dict[int, str] = {}
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        kind, _, sample_id = fields[0].partition("-")
        if kind == "T" and sample_id.isdigit():
            refs[int(sample_id)] = fields[1] if len(fields) > 1 else ""
        elif kind == "H" and sample_id.isdigit() and int(sample_id) not in hyps:
            hyps[int(sample_id)] = fields[2] if len(fields) > 2 else ""  # best (first) hypothesis
    if not refs:
        raise ValueError("no T- (reference) lines found: is this fairseq-generate output?")
    missing = sorted(set(refs) - set(hyps))
    if missing:
        raise ValueError(f"{len(missing)} references have no hypothesis (first id: {missing[0]})")
    ids = sorted(refs)
    return [hyps[i] for i in ids], [refs[i] for i in ids]


def score(hypotheses: List[str], references: List[str]) -> Dict[str, float]:
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
        raise ValueError(f"band width {width} (must be >= 1)")
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


if __name__ == "__main__":
    from .cli.score import main

    main(prog="python -m fairseq_memattn.score")
