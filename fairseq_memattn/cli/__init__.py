"""The command-line tools, one module per command, each a ``main`` over the library:

    fairseq-memattn-export     export.py     a checkpoint to ONNX graphs        (..export)
    fairseq-memattn-translate  translate.py  text through the exported graphs   (..deploy)
    fairseq-memattn-serve      serve.py      the same over HTTP                 (..deploy.serve)
    fairseq-memattn-convert    convert.py    a fairseq transformer to memory    (..convert)
    fairseq-memattn-plot       plot.py       attention figures                  (..plot)
    fairseq-memattn-score      score.py      BLEU and exact match of generate   (..score)

translate and serve import neither torch nor fairseq.
"""
