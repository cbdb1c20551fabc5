#!/usr/bin/env bash
# Train one of the paper's WMT'17 configurations with fairseq-train (Sec. 4.2, Table 2).
#   usage: recipes/wmt17/train.sh PAIR CONFIG [--data DIR] [--save-dir DIR] [--gpus N] [--dry-run]
#                                 [more fairseq-train options, which override the recipe's]
# CONFIG: att, k32, k64, k32_pe, k64_pe, optionally + _ENC-DEC scoring (e.g. k64_pe_softmax-softmax;
#         without it encoder sigmoid / decoder softmax, see docs/wmt17.md); or transformer,
#         transformer_k32, transformer_k64, each _k with an optional _mix.
# On GPUs: --fp16 and one process per GPU (fairseq's own spawning); --cpu without CUDA.
# The best checkpoint is chosen by validation BLEU (beam 10).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "${PYTHON:-python}" -m recipes.wmt17.run train "$@"
