#!/usr/bin/env bash
# The README's main job: set up .venv, then train a small memory-attention model on the
# copy task (lengths 0..20) on CPU, decode the test set with beam 10 and print BLEU/accuracy.
# Sigmoid scores on both sides (Sec. 4.2): the combination that converged fastest in results/copy
# (softmax/softmax, the paper's default, "consistently performs badly" there and here).
# About 4 minutes on 2 cores, the venv included (docs/testing.md). Output: $OUT (default checkpoints/copy_quickstart).
# Extra arguments go to fairseq-train (e.g. --seed 2); SKIP_SETUP=1 uses the fairseq on PATH;
# COPY_ARGS replaces the copy task's options (tests/test_readme.py makes them tiny).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-checkpoints/copy_quickstart}
[ "${SKIP_SETUP:-0}" = 1 ] || { bash recipes/setup.sh; export PATH="$PWD/.venv/bin:$PATH"; }

COPY_ARGS=${COPY_ARGS:-"--copy-max-len 20 --copy-train-size 20000 --copy-valid-size 500 --copy-test-size 500"} \
recipes/copy/train_eval.sh "$OUT" \
  --arch lstm_memattn --memory-k 16 --memory-encoder-score sigmoid --memory-decoder-score sigmoid \
  --encoder-hidden-size 128 --decoder-hidden-size 128 --encoder-embed-dim 64 --decoder-embed-dim 64 \
  --dropout 0 --optimizer adam --lr 3e-3 --clip-norm 1 --batch-size 64 --max-update 3000 \
  --log-interval 100 --no-progress-bar --cpu --seed 1 "$@"
# What to expect (docs/testing.md; `python tests/measure_trained.py quickstart` measures more).
echo "expected: BLEU 95-100, exact match 85-100% (seeds 1-5 x OMP_NUM_THREADS 1, 2: 95.33-99.95, 85.0-99.8; docs/testing.md)"
