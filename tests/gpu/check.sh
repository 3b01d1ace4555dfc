#!/usr/bin/env bash
# The GPU check of issue 28 as one command: set up .venv as the README does (kept when it is
# there), then run tests/gpu/check.py (its docstring says what it does).
#
#   tests/gpu/check.sh [--out DIR] [--steps N] [--rated-tflops T]   # on one GPU: within 6 minutes
#   tests/gpu/check.sh --cpu [--out DIR]                             # the dry run, a tiny Llama on the CPU
#
# Exit 0: every step trained and every check passed (the goals are printed, never failed on);
# 1: a step or a check failed (the lines starting FAILED say which); 2: no CUDA device.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! .venv/bin/python -c 'import swarmd, torch' 2>/dev/null; then
    # A python3 whose torch already computes on CUDA lends it to a new .venv: dev-env.sh then
    # keeps that torch instead of downloading one.
    if [[ " $* " != *" --cpu "* ]] && [ ! -e .venv ] \
        && python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
        python3 -m venv --system-site-packages .venv
    fi
    bash packaging/dev-env.sh
fi
exec .venv/bin/python -m tests.gpu.check "$@"
