#!/usr/bin/env bash
# Make (or refresh) the development environment in .venv: swarmd editable, with its test tools.
#
# torch comes first and pinned (SWARMD_TORCH, default torch==2.13.0): on Linux x86_64 with
# this version pip can take a CPU build, and a torch already in .venv is kept, so the rest of
# the install never pulls a multi-GB CUDA build by accident. The package itself asks for a
# normal range (see pyproject.toml), so users installing swarmd get their platform's torch.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "swarmd needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2
    exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    echo "installing ${SWARMD_TORCH:-torch==2.13.0} into .venv" >&2
    pip install "${SWARMD_TORCH:-torch==2.13.0}"
fi
echo "installing swarmd and its dependencies into .venv" >&2
pip install -e '.[test]'
