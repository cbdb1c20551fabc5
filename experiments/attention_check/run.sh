#!/usr/bin/env bash
# Standard attention on the copy task at L = 50: which attention, input feeding and learning rate
# learn it at the converged sweep's CPU preset (recipes/copy/sweep.py --preset cpu: 2x128 units,
# 64-d embeddings, no dropout, Adam 1e-3, clipping at 1, batch 64), 2,000 updates, seed 1, training
# only (validation loss every 500 updates). Run from the repository root, one thread per run:
#   bash experiments/attention_check/run.sh
set -euo pipefail
OUT=experiments/attention_check
ARGS=$(python -c "import sys; from recipes.copy import sweep; print(' '.join(sweep.PRESETS['cpu']['train']))")
export OMP_NUM_THREADS=1 COPY_ARGS="--copy-max-len 50" SKIP_GENERATE=1
run() {  # NAME fairseq-train options...
  local name=$1; shift
  recipes/copy/train_eval.sh "$OUT/$name" "$@" $ARGS --max-update "${UPDATES:-2000}" --seed 1 --no-progress-bar \
    --log-interval 100 > /dev/null
}
run additive              --arch lstm_att
run additive_if           --arch lstm_att --input-feeding
run additive_lr3e-4       --arch lstm_att --lr 3e-4
run general               --arch lstm_att --attention-type general
run general_if            --arch lstm_att --attention-type general --input-feeding
run fairseq_lstm          --arch lstm --encoder-bidirectional --encoder-layers 2 --decoder-layers 2 \
                          --decoder-out-embed-dim 128
run K16_softmax-softmax   --arch lstm_memattn --memory-k 16 --memory-encoder-score softmax \
                          --memory-decoder-score softmax
run K16_softmax-softmax_time --arch lstm_memattn --memory-k 16 --memory-encoder-score softmax \
                          --memory-decoder-score softmax --memory-encoder-normalize time
# Position information in the write (does it speed up learning the copy?): Eq. 8-10's position
# encodings, and the learned soft window of --memory-position-window (on in transformer_memattn).
run K16_softmax-softmax_pe --arch lstm_memattn --memory-k 16 --memory-encoder-score softmax \
                          --memory-decoder-score softmax --memory-position-encoding
run K16_softmax-softmax_window --arch lstm_memattn --memory-k 16 --memory-encoder-score softmax \
                          --memory-decoder-score softmax --memory-position-window
# The decoder of google/seq2seq (which the paper's implementation is based on, Sec. 4.1.1) feeds the
# previous context into the LSTM's input (input feeding): does that speed up memory attention?
run K16_softmax-softmax_if --arch lstm_memattn --memory-k 16 --memory-encoder-score softmax \
                          --memory-decoder-score softmax --input-feeding
# ... and its output layer, softmax(W_o tanh(W_m [h; c])) (its "attention_mix", Luong et al.'s
# attentional hidden state, also fairseq's lstm's) instead of Eq. 3's softmax(W [h; c]); both together.
run K16_softmax-softmax_mix --arch lstm_memattn --memory-k 16 --memory-encoder-score softmax \
                          --memory-decoder-score softmax --attention-mix
run K16_softmax-softmax_if_mix --arch lstm_memattn --memory-k 16 --memory-encoder-score softmax \
                          --memory-decoder-score softmax --input-feeding --attention-mix
# At L = 100 and the sweep's screening budget (3,000 updates): input feeding against the sweep's own
# K = 16 softmax/softmax screen (results/copy/converged/runs/L100_K16_softmax-softmax_s1).
COPY_ARGS="--copy-max-len 100" UPDATES=3000 run L100_K16_softmax-softmax_if --arch lstm_memattn --memory-k 16 \
    --memory-encoder-score softmax --memory-decoder-score softmax --input-feeding
