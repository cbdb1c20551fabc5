"""WMT'17 data for the paper's Table 2 (Sec. 4.2): download, check, BPE, binarize.

The data half of the WMT'17 recipe; its command line, with training and
evaluation, is ``run.py`` (``python -m recipes.wmt17.run
{prepare,train,evaluate}``, which ``recipes/wmt17/*.sh`` call). This module
imports nothing from it.

The paper trained on the WMT'17 "preprocessed" corpora
(tokenised and truecased by the organisers), with a shared 16k BPE vocabulary,
newstest2015 for validation and newstest2016 for test. We undo the organisers'
truecasing and tokenisation (sacremoses), so that the model reads and writes
plain text: sentencepiece's BPE then works on raw text, fairseq-interactive
takes raw sentences and the test score is detokenised sacreBLEU against the
official references.

Only ``download`` needs the network, and only it is limited to the paper's four
pairs. Everything after it reads the plain-text files ``train|valid|test.{src,tgt}``
of one directory: the downloaded ones, or the user's (``raw_dir``, for offline
machines or any other language pair). Each step writes to a temporary name and
renames it when complete, and skips an output that exists; once a step has run,
every later step runs again, so nothing is built from an older version of its input.
An output directory prepared from another corpus (OUT/raw.sha256.json keeps the digests of
the files it was prepared from), pair or vocabulary size is refused (``check_prepared``) rather
than kept.
"""

import filecmp
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from typing import Dict, FrozenSet, NamedTuple, Set, Tuple

# The pairs the download step knows (the paper's); a user's own corpus may be any pair.
PAIRS = ("en-cs", "en-de", "en-fi", "en-tr")
# fairseq names its files SPLIT.SRC-TGT.LANG.bin, so a code cannot hold '.' or '-'.
LANGUAGE_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
SPLITS = ("train", "valid", "test")
PREPROCESSED = "http://data.statmt.org/wmt17/translation-task/preprocessed/{xx}-en/corpus.tc.{lang}.gz"
# sacrebleu test sets: newstest2015 for validation and newstest2016 for test, as in
# the paper; WMT'15 had no Turkish, so en-tr validates on newsdev2016.
SACREBLEU_SETS = {"valid": "wmt15", "test": "wmt16"}
SACREBLEU_SETS_TR = {"valid": "wmt16/dev", "test": "wmt16"}
VOCAB_SIZE = 16000
SPM_NORMALIZATION = "nmt_nfkc"  # sentencepiece's default


class DataError(ValueError):
    """Input that would make training fail or train on the wrong data."""


def check_pair(pair: str) -> Tuple[str, str]:
    """(source, target) language codes of a pair written SRC-TGT, e.g. en-fr,
    else a DataError naming the bad value."""
    codes = pair.split("-")
    if len(codes) != 2 or not all(LANGUAGE_CODE.fullmatch(code) for code in codes) or codes[0] == codes[1]:
        raise DataError(f"invalid language pair {pair!r} (expected two different language codes "
                        "joined by '-', like en-fr; a code is letters, digits and '_', starting "
                        "with a letter)")
    return codes[0], codes[1]


def check_download_pair(pair: str) -> Tuple[str, str]:
    """check_pair, and a DataError for a pair the WMT'17 download does not cover."""
    langs = check_pair(pair)
    if pair not in PAIRS:
        raise DataError(f"no WMT'17 download for {pair!r} (the download covers {', '.join(PAIRS)}; "
                        f"for any other pair give your own corpus with --raw-dir DIR holding "
                        f"{{train,valid,test}}.{{{','.join(langs)}}})")
    return langs


def test_sets(pair: str) -> Dict[str, str]:
    return SACREBLEU_SETS_TR if pair == "en-tr" else SACREBLEU_SETS


def count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


class RawCorpus(NamedTuple):
    counts: Dict[str, int]  # lines per side, by split
    digests: Dict[str, str]  # each file's SHA-256, by name (train.en, ...)
    empty_train: FrozenSet[int]  # training pairs (0-based) with a side without text: left out

    def kept(self) -> Dict[str, int]:
        """Sentence pairs per split once the empty training pairs are left out."""
        return dict(self.counts, train=self.counts["train"] - len(self.empty_train))


def check_raw(raw_dir: str, pair: str) -> RawCorpus:
    """The raw corpus read once: a DataError for a missing file, sides of different length or a
    split without any text, before anything is built."""
    langs = check_pair(pair)
    missing = [f"{s}.{lang}" for s in SPLITS for lang in langs
               if not os.path.isfile(os.path.join(raw_dir, f"{s}.{lang}"))]
    if missing:
        raise DataError(f"missing in {raw_dir}: {', '.join(missing)} (need train, valid and test "
                        f"files for both sides: {{train,valid,test}}.{{{','.join(langs)}}})")
    counts, digests, empty_train = {}, {}, frozenset()
    for split in SPLITS:
        paths = [os.path.join(raw_dir, f"{split}.{lang}") for lang in langs]
        (n, empty, digest), (n_tgt, empty_tgt, digest_tgt) = (read_raw(p, split) for p in paths)
        if n != n_tgt:
            raise DataError(f"{paths[0]} has {n} lines but {paths[1]} has {n_tgt}: "
                            "source and target must be parallel, one sentence per line")
        counts[split] = n
        digests.update({os.path.basename(paths[0]): digest, os.path.basename(paths[1]): digest_tgt})
        if split == "train":
            empty_train = frozenset(empty | empty_tgt)
            if len(empty_train) == n:
                raise DataError(f"no pair of {paths[0]} and {paths[1]} has text on both sides: "
                                "the training corpus has no sentence pair")
    return RawCorpus(counts, digests, empty_train)


def read_raw(path: str, split: str) -> Tuple[int, Set[int], str]:
    """A raw file's lines (each ended by \n, or \r\n), those without text (0-based: nothing left
    once sentencepiece has normalized it, as a BOM, a zero-width space or control characters alone)
    and its SHA-256; a DataError for a file without text, a line that is not UTF-8, or a carriage
    return inside a line, where Python's and sacrebleu's readers would start a new line and shift
    every sentence after it against the other side."""
    import sentencepiece as spm

    normalize = spm.SentencePieceNormalizer(rule_name=SPM_NORMALIZATION).normalize
    lines, empty, digest = 0, set(), hashlib.sha256()
    with open(path, "rb") as f:
        for lines, line in enumerate(f, 1):
            digest.update(line)
            body = line.rstrip(b"\n")
            body = body[:-1] if body.endswith(b"\r") else body
            try:
                if not normalize(body.decode("utf-8")):
                    empty.add(lines - 1)
            except UnicodeDecodeError as error:
                raise DataError(f"{path} line {lines} is not UTF-8 (byte {body[error.start]:#04x}): convert "
                                f"the file to UTF-8, e.g. iconv -f latin1 -t utf-8") from None
            if b"\r" in body:
                raise DataError(f"{path} line {lines} holds a carriage return (\\r) inside the line, which "
                                f"readers take for a line break: remove it, e.g. tr -d '\\r'")
    if len(empty) == lines:
        raise DataError(f"{path} is empty: the {split} corpus has no text")
    return lines, empty, digest.hexdigest()


def atomic_output(path: str) -> str:
    """A temporary name beside ``path`` for a step to write; ``commit`` renames it."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return f"{path}.tmp{os.getpid()}"


def commit(tmp: str, path: str):
    if os.path.isdir(path):  # a directory output being rebuilt
        shutil.rmtree(path)
    os.replace(tmp, path)


# ---- download (the only step that needs the network) ----

def fetch(url: str, path: str):
    if os.path.exists(path):
        print(f"skip: {path} exists", flush=True)
        return
    tmp = atomic_output(path)
    print(f"download {url}", flush=True)
    with urllib.request.urlopen(url) as response, open(tmp, "wb") as out:
        shutil.copyfileobj(response, out)
    commit(tmp, path)


def detokenize_corpus(source: str, path: str, lang: str):
    """The organisers' tokenised, truecased text back to plain text."""
    try:
        from sacremoses import MosesDetokenizer, MosesDetruecaser
    except ImportError as error:
        raise SystemExit("wmt17: detokenising the WMT'17 corpus needs sacremoses "
                         "(pip install sacremoses)") from error
    detok, detrue = MosesDetokenizer(lang=lang), MosesDetruecaser()
    tmp = atomic_output(path)
    with gzip.open(source, "rt", encoding="utf-8") as lines, open(tmp, "w", encoding="utf-8") as out:
        for line in lines:
            tokens = detrue.detruecase(line.strip())
            out.write(detok.detokenize(tokens) + "\n")
    commit(tmp, path)


def echo_test_set(test_set: str, pair: str, side: str, path: str):
    """A newstest set's source or reference through sacrebleu (which caches it)."""
    tmp = atomic_output(path)
    with open(tmp, "w", encoding="utf-8") as out:
        subprocess.run([sys.executable, "-m", "sacrebleu", "-t", test_set, "-l", pair, "--echo", side],
                       stdout=out, check=True)
    commit(tmp, path)


def download(pair: str, out: str) -> str:
    """The WMT'17 preprocessed training corpus and the newstest sets, as plain
    text in OUT/raw; files already in OUT/download are used as they are."""
    langs = check_download_pair(pair)
    raw = os.path.join(out, "raw")
    for lang in langs:
        path = os.path.join(raw, f"train.{lang}")
        if os.path.exists(path):
            print(f"skip: {path} exists", flush=True)
            continue
        gz = os.path.join(out, "download", f"corpus.tc.{lang}.gz")
        fetch(PREPROCESSED.format(xx=langs[1], lang=lang), gz)
        detokenize_corpus(gz, path, lang)
    for split, test_set in test_sets(pair).items():
        for lang, side in zip(langs, ("src", "ref")):
            path = os.path.join(raw, f"{split}.{lang}")
            if not os.path.exists(path):
                echo_test_set(test_set, pair, side, path)
    return raw


# ---- after download: BPE and binarization ----

def copy_file(source: str, path: str):
    tmp = atomic_output(path)
    shutil.copyfile(source, tmp)
    commit(tmp, path)


def learn_bpe(raw: str, langs, model: str, vocab_size: int):
    """A joint BPE model of both sides' training text (sentencepiece, --model_type bpe)."""
    import sentencepiece as spm

    tmp = atomic_output(model)
    try:
        spm.SentencePieceTrainer.train(
            input=",".join(os.path.join(raw, f"train.{lang}") for lang in langs),
            model_prefix=tmp, model_type="bpe", vocab_size=vocab_size, character_coverage=1.0,
            normalization_rule_name=SPM_NORMALIZATION,
            input_sentence_size=10_000_000, shuffle_input_sentence=True, num_threads=1,
            minloglevel=2)
    except RuntimeError as error:
        most = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", str(error))
        if most:
            raise DataError(f"invalid --vocab-size: {vocab_size} (the training text allows at most "
                            f"{most.group(1)} BPE pieces; use a smaller --vocab-size)") from None
        least = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", str(error))
        if least:
            raise DataError(f"invalid --vocab-size: {vocab_size} (the training text needs at least "
                            f"{least.group(1)} pieces, one per character and sentencepiece's own; use a "
                            f"larger --vocab-size)") from None
        raise
    os.replace(tmp + ".vocab", model[: -len(".model")] + ".vocab")
    commit(tmp + ".model", model)


def encode(model: str, source: str, path: str, leave_out: FrozenSet[int] = frozenset()):
    """SOURCE in BPE pieces, one line per line but those LEAVE_OUT numbers (0-based)."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=model)
    tmp = atomic_output(path)
    with open(source, encoding="utf-8") as lines, open(tmp, "w", encoding="utf-8") as out:
        for number, line in enumerate(lines):
            if number not in leave_out:
                out.write(" ".join(processor.encode(line.strip(), out_type=str)) + "\n")
    commit(tmp, path)


def binarize(bpe_dir: str, langs, dest: str, workers: int):
    tmp = atomic_output(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    prefix = {split: os.path.join(bpe_dir, split) for split in SPLITS}
    subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "fairseq-preprocess"),
         "--source-lang", langs[0], "--target-lang", langs[1], "--trainpref", prefix["train"],
         "--validpref", prefix["valid"], "--testpref", prefix["test"], "--joined-dictionary",
         "--destdir", tmp, "--workers", str(workers)], check=True)
    commit(tmp, dest)


DIGESTS = "raw.sha256.json"  # in OUT: the raw files it was prepared from


def check_prepared(out: str, raw: str, langs, counts: Dict[str, int], vocab_size: int, digests: Dict[str, str]):
    """A DataError where OUT holds outputs of another corpus, pair or --vocab-size: prepare
    would skip them as done and keep them. The corpus is told by its files' digests, or where OUT
    was prepared before they were kept, by its line counts and references."""
    found = []
    recorded, prepared_from = os.path.join(out, DIGESTS), None
    if os.path.exists(recorded):
        with open(recorded, encoding="utf-8") as f:
            prepared_from = json.load(f)
        changed = [os.path.join(raw, name) for name, digest in digests.items() if prepared_from.get(name) != digest]
        if changed:
            found.append(f"{', '.join(changed)} not the text it was prepared from")
    model = os.path.join(out, "spm.model")
    if os.path.exists(model):
        import sentencepiece as spm

        pieces = spm.SentencePieceProcessor(model_file=model).get_piece_size()
        if pieces != vocab_size:
            found.append(f"spm.model of {pieces} pieces, not --vocab-size {vocab_size}")
    for split in SPLITS:
        for lang in langs:
            bpe = os.path.join(out, "bpe", f"{split}.{lang}")
            lines = count_lines(bpe) if os.path.exists(bpe) else counts[split]
            if lines != counts[split]:
                found.append(f"{bpe} of {lines} lines, not {counts[split]}")
    for split in ("valid", "test") if prepared_from is None else ():  # digests say it for the references too
        ref = os.path.join(out, "ref", f"{split}.{langs[1]}")
        if os.path.exists(ref) and not filecmp.cmp(ref, os.path.join(raw, f"{split}.{langs[1]}"), shallow=False):
            found.append(f"{ref} of another corpus")
    binarized = os.path.join(out, "data-bin")
    pair = "-".join(langs)
    if os.path.isdir(binarized) and not os.path.isfile(os.path.join(binarized, f"train.{pair}.{langs[0]}.idx")):
        found.append(f"{binarized} without {pair}")
    if found:  # what prepare built, not the download (raw/, download/), which took hours to fetch
        built = [name for name in (DIGESTS, "spm.model", "spm.vocab", "ref", "bpe", "data-bin")
                 if os.path.exists(os.path.join(out, name))]
        raise DataError(f"--out {out} holds data prepared with other settings ({'; '.join(found[:3])}): "
                        f"give another --out, or remove what prepare built there ({', '.join(built)})")


def prepare(pair: str, out: str, raw_dir: str = None, vocab_size: int = VOCAB_SIZE,
            workers: int = 1) -> Dict[str, int]:
    """Everything up to OUT/data-bin; returns the sentence counts per split.
    Without ``raw_dir`` the pair's WMT'17 corpus is downloaded first."""
    langs = check_pair(pair) if raw_dir else check_download_pair(pair)
    raw = raw_dir or download(pair, out)
    corpus = check_raw(raw, pair)
    counts = corpus.kept()
    check_prepared(out, raw, langs, counts, vocab_size, corpus.digests)
    recorded = os.path.join(out, DIGESTS)
    if not os.path.exists(recorded):
        tmp = atomic_output(recorded)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(corpus.digests, f, indent=1)
        commit(tmp, recorded)
    left_out = (f" ({len(corpus.empty_train)} more with an empty side left out, as Moses' clean-corpus-n does)"
                if corpus.empty_train else "")
    print(f"{pair}: {counts['train']} training{left_out}, {counts['valid']} validation, "
          f"{counts['test']} test sentence pairs in {raw}", flush=True)
    model = os.path.join(out, "spm.model")
    bpe = os.path.join(out, "bpe")
    steps = [(os.path.join(out, "ref", f"{s}.{langs[1]}"),
              lambda path, s=s: copy_file(os.path.join(raw, f"{s}.{langs[1]}"), path))
             for s in ("valid", "test")]
    steps.append((model, lambda path: learn_bpe(raw, langs, path, vocab_size)))
    steps += [(os.path.join(bpe, f"{s}.{lang}"),
               lambda path, s=s, lang=lang: encode(model, os.path.join(raw, f"{s}.{lang}"), path,
                                                   corpus.empty_train if s == "train" else frozenset()))
              for s in SPLITS for lang in langs]
    steps.append((os.path.join(out, "data-bin"), lambda path: binarize(bpe, langs, path, workers)))
    rebuilt = False
    for path, build in steps:
        if os.path.exists(path) and not rebuilt:
            print(f"skip: {path} exists", flush=True)
            continue
        print(f"build: {path}", flush=True)
        build(path)
        rebuilt = True
    return counts


if __name__ == "__main__":
    raise SystemExit("recipes/wmt17/data.py is the data library; the command line is "
                     "python -m recipes.wmt17.run {prepare,train,evaluate} (or recipes/wmt17/*.sh)")
