"""Raw text to source token ids and hypotheses back to text, as fairseq-interactive with
``--bpe sentencepiece`` does it."""

import os
from typing import List, Optional, Tuple

from ..errors import import_installed
from .dictionary import Dictionary
from .exceptions import SourceError


class SentencePiece:
    """fairseq's --bpe sentencepiece: pieces joined by spaces in, and back out."""

    def __init__(self, path: str):
        sentencepiece = import_installed("sentencepiece", "--bpe sentencepiece needs the sentencepiece package: "
                                                          "pip install sentencepiece")
        if os.path.isdir(path):
            raise ValueError(f"{path} is a folder, not a sentencepiece model")
        if not os.path.isfile(path):
            raise ValueError(f"{path}: no such sentencepiece model")
        try:
            self.model = sentencepiece.SentencePieceProcessor(model_file=path)
        except (OSError, RuntimeError) as error:
            reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
            raise ValueError(f"{path} is not a sentencepiece model ({reason})") from None

    def encode(self, line: str) -> str:
        return " ".join(self.model.encode(line, out_type=str))

    @staticmethod
    def decode(line: str) -> str:
        return line.replace(" ", "").replace("\u2581", " ").strip()


class TextCodec:
    """A model's dictionaries with its sentencepiece model, if any."""

    def __init__(self, src_dict: Dictionary, tgt_dict: Dictionary, sentencepiece_model: Optional[str] = None):
        self.src_dict, self.tgt_dict = src_dict, tgt_dict
        self.bpe = SentencePiece(sentencepiece_model) if sentencepiece_model else None

    def source(self, line: str) -> Tuple[str, List[int]]:
        """The line as fairseq-interactive's S- line shows it (unknown words as <unk>) and its
        token ids, EOS last. SourceError for a str that is not Unicode text (a lone surrogate, which
        JSON's \\ud800 escapes can make), which sentencepiece cannot encode."""
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as error:
            raise SourceError(f"not Unicode text: a lone surrogate {line[error.start]!r} at character "
                              f"{error.start}") from None
        ids = self.src_dict.encode(self.bpe.encode(line) if self.bpe else line)
        return self.src_dict.string(ids), ids

    def target(self, tokens) -> Tuple[str, str]:
        """A hypothesis's tokens as pieces (fairseq's H- line) and as detokenized text (D-)."""
        pieces = self.tgt_dict.string(tokens)
        return pieces, self.bpe.decode(pieces) if self.bpe else pieces
