#!/usr/bin/env bash
# Beyond the converged sweep's cap: does K = 16 memory attention reach fairseq lstm's level at
# L = 100 (99.93 BLEU) given more updates? Continues the sweep's K = 16 softmax/softmax seed-1 run
# (results/copy/converged/runs/L100_K16_softmax-softmax_s1, stopped by the CPU preset's cap at
# 12,000 updates, validation loss still falling) from its last checkpoint with the preset's options,
# patience 5 as before, but up to 30,000 updates at the same learning rate, or 18,000 at the
# paper's; then decodes and scores it as the sweep does (beam 10, --min-len 0, checkpoint_best.pt).
# Resumable. From the repository root:
#   OMP_NUM_THREADS=1 bash experiments/beyond_cap/run.sh
set -euo pipefail
FROM=results/copy/converged/runs/L100_K16_softmax-softmax_s1
ARGS=$(python -c "import sys; from recipes.copy import sweep; print(' '.join(sweep.PRESETS['cpu']['train']))")
continue_run() {  # NAME [fairseq-train options that override the preset's...]
  local out=experiments/beyond_cap/$1; shift
  # decoded: its training ended (resuming would restart fairseq's patience counter and train on)
  [ ! -e "$out/score.json" ] || return 0
  if [ ! -e "$out/checkpoint_last.pt" ]; then  # start from the sweep's run; its log holds the curve so far
    mkdir -p "$out"
    cp "$FROM/checkpoint_last.pt" "$FROM/checkpoint_best.pt" "$FROM/train.log" "$out/"
  fi
  COPY_ARGS="--copy-max-len 100" recipes/copy/train_eval.sh "$out" --arch lstm_memattn --memory-k 16 \
    --memory-encoder-score softmax --memory-decoder-score softmax $ARGS --max-update 30000 --seed 1 \
    --no-progress-bar --log-interval 100 "$@" > /dev/null
  python -m fairseq_memattn.cli.score "$out/generate.test.txt" --by-length 20 > "$out/by_length.md"
}
continue_run L100_K16_softmax-softmax_s1                 # the same learning rate, 1e-3
continue_run L100_K16_softmax-softmax_s1_lr1e-4 --lr 1e-4 --max-update 18000  # the paper's learning rate (Sec. 4.1)
