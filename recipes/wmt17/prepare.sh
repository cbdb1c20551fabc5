#!/usr/bin/env bash
# WMT'17 data as in the paper (Sec. 4.2): the organisers' preprocessed corpus, newstest2015
# (validation) and newstest2016 (test), a joint 16k sentencepiece BPE, fairseq-preprocess.
#   usage: recipes/wmt17/prepare.sh PAIR [--out DIR] [--raw-dir DIR] [--vocab-size N] [--workers N]
# PAIR: en-cs, en-de, en-fi or en-tr for the WMT'17 download; with --raw-dir, any SRC-TGT (e.g. en-fr).
# Output: data/wmt17/PAIR/{raw,spm.model,bpe,ref,data-bin}.
# Your own corpus (or offline): --raw-dir DIR with plain-text {train,valid,test}.{SRC,TGT}; or put the
# downloaded corpus.tc.{en,xx}.gz in data/wmt17/PAIR/download/. Re-running skips finished steps.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python}" -m recipes.wmt17.run prepare "$@"
