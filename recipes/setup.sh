#!/usr/bin/env bash
# Make .venv with torch, a fairseq distribution and fairseq_memattn (+ test tools, the ONNX export
# and translator, the translation server).
#   TORCH_SPEC    torch to install first (default torch==2.13.0; a bare "torch" may pull a CUDA build)
#   FAIRSEQ_SPEC  fairseq distribution (default ve-fairseq==0.12.3, a Python 3.11/3.12 wheel of
#                 fairseq main); "keep" installs none and uses the fairseq the venv already has
#   VENV          where to make the venv (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
FAIRSEQ_SPEC=${FAIRSEQ_SPEC:-ve-fairseq==0.12.3}

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q "$TORCH_SPEC"
[ "$FAIRSEQ_SPEC" = keep ] || "$VENV/bin/pip" install -q "$FAIRSEQ_SPEC"
"$VENV/bin/pip" install -q ".[test,deploy,serve]"
"$VENV/bin/python" -c "import fairseq, torch, fairseq_memattn; print('fairseq', fairseq.__version__, '| torch', torch.__version__, '| fairseq_memattn ready')"
