"""Translate with a model exported by ``fairseq-memattn-export``, on ONNX Runtime, with numpy,
onnxruntime and sentencepiece only (neither torch nor fairseq): ``Translator`` (translator.py),
raw text in and out (text.py), the command line (``python -m fairseq_memattn.deploy``,
``fairseq-memattn-translate``) and the HTTP server (serve.py, ``fairseq-memattn-serve``)."""

from .text import SentencePiece, TextCodec  # noqa: F401
from .translator import (Dictionary, ModelFolderError, SelfAttentionCache, SourceError,  # noqa: F401
                         SourceTooLong, Translator, batches_by_tokens)
