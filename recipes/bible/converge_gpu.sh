#!/usr/bin/env bash
# On the GPU machine (no network): install the wheels `converge.py pack` put in .gpu/wheels (what its
# image lacks), then `converge.py run "$@"` with its output also in OUT/run.log.
#   usage: bash recipes/bible/converge_gpu.sh --out "$OUT" [converge.py run options]
set -euo pipefail
cd "$(dirname "$0")/../.."
# The options checked, and --out read, before the install: converge.py's parser needs no fairseq.
out=$(python3 -m recipes.bible.converge run --check "$@")
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
mkdir -p "$out"
python3 -m recipes.bible.converge run "$@" 2>&1 | tee "$out/run.log"
