"""fairseq-memattn-export: a checkpoint to ONNX graphs for ONNX Runtime.

    fairseq-memattn-export CHECKPOINT OUT [--data DIR] [--quantize int8] [--force]
"""

import argparse
import sys

from .. import export as library
from ..export import ExportError, export


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="fairseq-memattn-export", description=__doc__ + "\n" + library.__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a fairseq checkpoint of transformer_memattn or lstm_memattn")
    parser.add_argument("out", help="output folder")
    parser.add_argument("--data", help="the data folder with the dictionaries (default: the checkpoint's)")
    parser.add_argument("--quantize", choices=["int8"], help="dynamic int8 quantization of the weights")
    parser.add_argument("--force", action="store_true",
                        help="export into a folder that is not empty, replacing an earlier export's files")
    parser.add_argument("--sentencepiece-model", help="copy this sentencepiece model into OUT "
                                                      "(default: spm.model of the data folder, if any)")
    return parser, parser.parse_args(argv)


def main(argv=None):
    parser, args = parse_args(argv)
    try:
        config = export(args.checkpoint, args.out, args.data, args.quantize, args.sentencepiece_model,
                        args.force)
    except ExportError as error:
        parser.error(str(error))
    print(f"exported {config['model']} ({args.quantize or 'float32'}) to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
