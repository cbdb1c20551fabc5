"""Score fairseq-generate output as the paper did, plus exact-match accuracy.

    python -m fairseq_memattn.score generate.out

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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("generate_output", help="file written by fairseq-generate ('-' for stdin)")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    args = parser.parse_args(argv)
    stream = sys.stdin if args.generate_output == "-" else open(args.generate_output, encoding="utf-8")
    with stream:
        try:
            result = score(*read_generate_output(stream))
        except ValueError as error:
            parser.error(f"{args.generate_output}: {error}")
    if args.json:
        print(json.dumps(result))
    else:
        print(f"BLEU {result['bleu']:.2f}  accuracy {result['accuracy']:.2f}%  "
              f"({result['sentences']} sentences)")


if __name__ == "__main__":
    main()
