#!/usr/bin/env bash
# Train one copy-task configuration, decode its test set with beam 10, score it.
#   usage: COPY_ARGS="--copy-max-len 20" recipes/copy/train_eval.sh OUT_DIR [fairseq-train args...]
# COPY_ARGS (task options) go to both fairseq-train and fairseq-generate, so both see the same data.
# Writes OUT_DIR/{train.log,generate.test.txt.gz,score.json}; prints BLEU and exact-match accuracy.
# Resumable: fairseq-train continues from OUT_DIR/checkpoint_last.pt if there is one, and train.log is
# appended to, not truncated, so a resumed run's log holds its whole curve. SKIP_TRAIN=1 only decodes
# and scores OUT_DIR/checkpoint_best.pt (for a run whose training finished); SKIP_GENERATE=1 only
# trains (a sweep's screen, continued later or never decoded).
# A failing step's last log lines go to standard error: its log holds the rest.
set -euo pipefail
NAME=$(basename "$0")
if [ $# -lt 1 ] || [[ $1 == -* ]]; then
  echo "usage: [COPY_ARGS=\"--copy-max-len 20\"] $NAME OUT_DIR [fairseq-train args...]" >&2
  exit 2
fi
OUT=$1; shift
PLUGIN=$(cd "$(dirname "$0")/../.." && pwd)/fairseq_memattn
read -r -a TASK <<< "--task copy_task --user-dir $PLUGIN ${COPY_ARGS:-}"

# Before anything runs: every command this run needs is there.
NEEDED=(python)
[ -n "${SKIP_TRAIN:-}" ] || NEEDED+=(fairseq-train)
[ -n "${SKIP_GENERATE:-}" ] || NEEDED+=(fairseq-generate)
for command in "${NEEDED[@]}"; do
  command -v "$command" > /dev/null || {
    echo "$NAME: error: $command not found on PATH (make the venv with recipes/setup.sh and put its bin/ on PATH)" >&2
    exit 127
  }
done

failed() {  # STEP STATUS LOG: why, on standard error
  echo "$NAME: error: $1 failed (exit $2); the end of $3:" >&2
  # A one-line refusal (argparse's, the plugin's) says it all; else the traceback's end
  if tail -n 1 "$3" | grep -q "error: "; then tail -n 1 "$3"; else tail -n 10 "$3" | cut -c1-300; fi >&2
  exit "$2"
}

mkdir -p "$OUT"
if [ -z "${SKIP_TRAIN:-}" ]; then
  # Only the progress lines reach the terminal: grep's own status (no such line) does not count.
  fairseq-train "${TASK[@]}" --save-dir "$OUT" --no-epoch-checkpoints "$@" 2>&1 | tee -a "$OUT/train.log" \
    | { grep --line-buffered -E "\| (valid|train|train_inner) \||done training|early stop|Stopping training" || true; } \
    || failed fairseq-train $? "$OUT/train.log"
fi
[ -z "${SKIP_GENERATE:-}" ] || exit 0
# --required-batch-size-multiple 1: fairseq main drops a last batch smaller than the multiple.
# --min-len 0: about 1 in L+1 copy examples is empty, and fairseq's default (--min-len 1) forbids
# the empty hypothesis, which would cap exact-match accuracy at L/(L+1) and dent BLEU.
fairseq-generate "${TASK[@]}" --path "$OUT/checkpoint_best.pt" --gen-subset test --beam 10 \
  --min-len 0 --batch-size 64 --required-batch-size-multiple 1 \
  > "$OUT/generate.test.txt" 2> "$OUT/generate.log" || failed fairseq-generate $? "$OUT/generate.log"
grep -E "Translated" "$OUT/generate.log" | sed -E 's/.*INFO[^ ]* //' || true
# score.json marks the run done (the sweep driver skips it): written whole or not at all.
python -m fairseq_memattn.cli.score "$OUT/generate.test.txt" --json > "$OUT/score.json.partial"
mv "$OUT/score.json.partial" "$OUT/score.json" && cat "$OUT/score.json"
gzip -f "$OUT/generate.test.txt"  # a copy-task output is about 1 MB of digits; gzip keeps a fifth
