#!/usr/bin/env bash
# Decode newstest2016 with beam 10, remove the BPE and score detokenised sacreBLEU against the
# official reference; prints the sacreBLEU signature and the decoding time (Table 3).
#   usage: recipes/wmt17/evaluate.sh PAIR CHECKPOINT [--data DIR] [--subset test|valid] [--runs N]
#                                    [--out DIR] [--gpus N] [more fairseq-generate options]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python}" -m recipes.wmt17.run evaluate "$@"
