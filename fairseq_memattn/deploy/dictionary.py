"""fairseq's dictionary file (``dict.txt``), read as ``fairseq.data.Dictionary.load`` reads it."""

from typing import List

from .exceptions import ModelFolderError

OVERWRITE = "#fairseq:overwrite"


class Dictionary:
    """fairseq's Dictionary file (``symbol count`` per line, optionally ``#fairseq:overwrite``) with
    its four special symbols first. A line of another form, or a duplicate symbol without the flag,
    is refused (``ModelFolderError`` naming the file and line), as fairseq refuses it: a garbage file
    would otherwise turn every token into <unk>."""

    def __init__(self, path: str):
        self.symbols = ["<s>", "<pad>", "</s>", "<unk>"]
        self.index = {s: i for i, s in enumerate(self.symbols)}
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().split("\n")
        except FileNotFoundError:
            raise ModelFolderError(f"{path}: no such file (the folder's export is incomplete)") from None
        except (OSError, UnicodeDecodeError) as error:
            raise ModelFolderError(f"{path}: not readable as UTF-8 text ({error})") from None
        if lines and lines[-1] == "":
            lines.pop()  # the newline that ends the last line
        for number, line in enumerate(lines, start=1):
            self.add(line, path, number)
        self.bos, self.pad, self.eos, self.unk = 0, 1, 2, 3

    def add(self, line: str, path: str, number: int) -> None:
        """One line of the file, as fairseq's Dictionary.add_from_file reads it."""
        symbol, _, field = line.rstrip().rpartition(" ")
        overwrite = field == OVERWRITE
        if overwrite:
            symbol, _, field = symbol.rpartition(" ")
        try:
            int(field)
        except ValueError:
            symbol = ""
        if not symbol:
            raise ModelFolderError(f"{path}: line {number}: expected '<symbol> <count>' (an integer count, "
                                   f"optionally then {OVERWRITE}), got {line[:80]!r}")
        if symbol in self.index and not overwrite:
            raise ModelFolderError(f"{path}: line {number}: duplicate symbol {symbol!r} (fairseq accepts it "
                                   f"only with {OVERWRITE})")
        self.index[symbol] = len(self.symbols)  # an overwrite points the symbol at its new row, as fairseq
        self.symbols.append(symbol)

    def __len__(self):
        return len(self.symbols)

    def encode(self, line: str) -> List[int]:
        """Token ids of a whitespace-tokenized line, EOS appended."""
        return [self.index.get(w, self.unk) for w in line.split()] + [self.eos]

    def string(self, ids) -> str:
        """As fairseq's Dictionary.string: without EOS, padding and BOS."""
        return " ".join(self.symbols[i] for i in ids if i not in (self.eos, self.pad, self.bos))
