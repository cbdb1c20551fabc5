"""The command-line tools, one module per command, each a ``main`` over the library:

    fairseq-memattn-export     export.py     a checkpoint to ONNX graphs        (..export)
    fairseq-memattn-translate  translate.py  text through the exported graphs   (..deploy)
    fairseq-memattn-serve      serve.py      the same over HTTP                 (..deploy.serve)
    fairseq-memattn-convert    convert.py    a fairseq transformer to memory    (..convert)
    fairseq-memattn-plot       plot.py       attention figures                  (..plot)
    fairseq-memattn-score      score.py      BLEU and exact match of generate   (..score)

translate and serve import neither torch nor fairseq.
"""

import logging
import os
import sys


def log_to_stderr(level: str = "WARNING") -> None:
    """Log lines on stderr at $LOGLEVEL (fairseq's variable) or LEVEL. The level is set even where
    logging is configured already: fairseq's wav2vec2_classification module configures it at DEBUG
    when imported first, and every library's debug lines would follow."""
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", stream=sys.stderr)
    logging.getLogger().setLevel(os.environ.get("LOGLEVEL", level).upper())
