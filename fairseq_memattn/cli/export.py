"""fairseq-memattn-export: a checkpoint to ONNX graphs for ONNX Runtime."""

import argparse
import sys

from . import log_to_stderr
from ..arg_types import non_negative_int, path_given
from ..errors import one_line_errors

PROG = "fairseq-memattn-export"
# Kept here, not cut from a docstring: help must not change with python -OO.
DESCRIPTION = """\
fairseq-memattn-export: a checkpoint to ONNX graphs for ONNX Runtime.

    fairseq-memattn-export CHECKPOINT OUT [--data DIR] [--quantize int8] [--short-source-rows N] [--force]

Exports transformer_memattn (both reads; shared or per-layer memories) and lstm_memattn with
memory attention. OUT holds encoder.onnx (source -> what the decoder reads, projected once per
source (a source shorter than --short-source-rows: its |S| states, read through alpha), and
alpha of Eq. 4-5 for alignments), decoder.onnx (one decoder step with its cache,
ending in the beam search's choice of candidates), config.json, the dictionaries and, when
there is one, the sentencepiece model; fairseq-memattn-translate and fairseq-memattn-serve
translate with it. --quantize int8: every matrix product with a constant weight in int8, the
weight (7 bits) scaled per output column and the input per row, so that a sentence gets the same
translation in any batch, and the embedding tables in int8; an LSTM stays float32. Needs the
optional extra deploy (pip install ".[deploy]" in a checkout, or pip install onnx onnxruntime).
"""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a fairseq checkpoint of transformer_memattn or lstm_memattn")
    parser.add_argument("out", type=path_given, help="output folder")
    parser.add_argument("--data", help="the data folder with the dictionaries (default: the checkpoint's)")
    parser.add_argument("--quantize", choices=["int8"], help="int8 products (weights per column, inputs per row) and embeddings")
    parser.add_argument("--short-source-rows", type=non_negative_int, metavar="N",
                        help="transformer_memattn: a source of fewer than N tokens (EOS included) keeps its "
                             "memory as its |S| projected states, read through alpha, instead of K rows: "
                             "the same translation, less to read per step (default: K/2; 0: never)")
    parser.add_argument("--force", action="store_true",
                        help="export into a folder that is not empty, replacing an earlier export's files")
    parser.add_argument("--sentencepiece-model", help="copy this sentencepiece model into OUT "
                                                      "(default: spm.model of the data folder, if any)")
    return parser, parser.parse_args(argv)


def main(argv=None):
    parser, args = parse_args(argv)
    log_to_stderr()
    import fairseq_memattn

    from ..export import export

    fairseq_memattn.register()  # the architectures of the checkpoint
    with one_line_errors(PROG):
        config = export(args.checkpoint, args.out, args.data, args.quantize, args.sentencepiece_model,
                        args.force, args.short_source_rows)
    print(f"exported {config['model']} ({args.quantize or 'float32'}) to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
