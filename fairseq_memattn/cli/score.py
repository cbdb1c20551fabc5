"""fairseq-memattn-score: BLEU and exact-match accuracy of fairseq-generate's or the translator's output."""

import argparse
import json
import sys

from ..arg_types import positive_int
from ..errors import UserError, one_line_errors

PROG = "fairseq-memattn-score"
# Kept here, not cut from a docstring: help must not change with python -OO.
DESCRIPTION = """\
fairseq-memattn-score: BLEU (as the paper computed it: sacreBLEU without tokenisation, on the
tokens as printed) and exact-match accuracy of fairseq-generate's output, or of
fairseq-memattn-translate's (or fairseq-interactive's) with the references in a file.

    fairseq-memattn-score generate.out
    fairseq-memattn-score generate.out --by-length 20    # and per reference length 0-19, 20-39, ...
    fairseq-memattn-translate MODEL < test.src > translate.out
    fairseq-memattn-score translate.out --reference test.tgt
"""


def main(argv=None, prog=PROG):
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("generate_output", help="file written by fairseq-generate, or by "
                                                "fairseq-memattn-translate with --reference ('-' for stdin)")
    parser.add_argument("--reference", metavar="FILE",
                        help="the references, one per input line, for output without T- lines "
                             "(fairseq-memattn-translate, fairseq-interactive); its D- lines are scored")
    parser.add_argument("--json", action="store_true", help="print the scores as JSON")
    parser.add_argument("--by-length", type=positive_int, metavar="WIDTH",
                        help="also exact-match accuracy per band of WIDTH reference lengths")
    args = parser.parse_args(argv)
    from ..score import accuracy_by_length, read_generate_output, score

    references = None
    if args.reference is not None:
        try:
            with open(args.reference, encoding="utf-8-sig") as file:  # a BOM is not text
                references = [line.rstrip("\n") for line in file]
        except OSError as error:
            parser.error(f"--reference {args.reference}: {error.strerror}")
        except UnicodeDecodeError as error:
            parser.error(f"--reference {args.reference}: not UTF-8 text ({error.reason})")
    try:
        stream = sys.stdin if args.generate_output == "-" else open(args.generate_output, encoding="utf-8-sig")
    except OSError as error:
        parser.error(f"{args.generate_output}: {error.strerror}")
    with stream:
        try:
            hypotheses, references = read_generate_output(stream, references)
        except UserError as error:
            parser.error(f"{args.generate_output}: {error}")
        except UnicodeDecodeError as error:
            parser.error(f"{args.generate_output}: not UTF-8 text ({error.reason})")
    with one_line_errors(prog):
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
