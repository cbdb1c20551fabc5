"""Translate with a model exported by ``fairseq-memattn-export``, on ONNX Runtime, with numpy,
onnxruntime and sentencepiece only (neither torch nor fairseq): ``Translator`` (translator.py,
with its parts: config.py, dictionary.py, graphs.py, search.py, decoder.py, cache.py,
batching.py), raw text in and out (text.py), the command line (``python -m
fairseq_memattn.deploy``, ``fairseq-memattn-translate``) and the HTTP server (serve.py with
batcher.py, ``fairseq-memattn-serve``)."""

from .batching import batches_by_tokens  # noqa: F401
from .cache import SelfAttentionCache  # noqa: F401
from .dictionary import Dictionary  # noqa: F401
from .exceptions import ModelFolderError, SourceError, SourceTooLong  # noqa: F401
from .text import SentencePiece, TextCodec  # noqa: F401
from .translator import Translator  # noqa: F401
