"""Score fairseq-generate output as the paper did, plus exact-match accuracy.

    python -m fairseq_memattn.score generate.out
    python -m fairseq_memattn.score generate.out --by-length 20    # and per reference length 0-19, 20-39, ...

BLEU is sacreBLEU with no tokenisation on the already tokenised hypotheses and
references (what Moses' multi-bleu.perl computes, which the paper used);
accuracy is the share of hypotheses equal to their reference, which says more
on a copy task. Empty references (length-0 copy examples) count like any other:
an empty hypothesis is then exactly right.
"""

import argparse
import json
import sys
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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fairseq_memattn.score", description=__doc__.split("\n\n")[0])
    parser.add_argument("generate_output", help="file written by fairseq-generate ('-' for stdin)")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument("--by-length", type=int, metavar="WIDTH",
                        help="also exact-match accuracy per band of WIDTH reference lengths")
    args = parser.parse_args(argv)
    if args.by_length is not None and args.by_length < 1:
        parser.error(f"--by-length: {args.by_length} (must be >= 1)")
    try:
        stream = sys.stdin if args.generate_output == "-" else open(args.generate_output, encoding="utf-8")
    except OSError as error:
        parser.error(f"{args.generate_output}: {error.strerror}")
    with stream:
        try:
            hypotheses, references = read_generate_output(stream)
        except ValueError as error:
            parser.error(f"{args.generate_output}: {error}")
    result = score(hypotheses, references)
    if args.by_length:
        result["by_length"] = accuracy_by_length(hypotheses, references, args.by_length)
    if args.json:
        print(json.dumps(result))
        return
    print(f"BLEU {result['bleu']:.2f}  accuracy {result['accuracy']:.2f}%  "
          f"({result['sentences']} sentences)")
    for band in result.get("by_length", []):
        print(f"  length {band['lengths']:>9}: {band['accuracy']:6.2f}% exact  "
              f"({band['exact']} of {band['sentences']}; {band['reordered']} more in another order)")


if __name__ == "__main__":
    main()
