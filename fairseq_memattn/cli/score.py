"""fairseq-memattn-score: BLEU (as the paper computed it) and exact-match accuracy of
fairseq-generate output.

    fairseq-memattn-score generate.out
    fairseq-memattn-score generate.out --by-length 20    # and per reference length 0-19, 20-39, ...
"""

import argparse
import json
import sys

from ..score import accuracy_by_length, read_generate_output, score


def main(argv=None, prog="fairseq-memattn-score"):
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
