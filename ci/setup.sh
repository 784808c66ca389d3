#!/usr/bin/env bash
# Creates .venv (once) and installs tfemb with TensorFlow (the `tensorflow`
# build and tf-keras: the extra `tensorflow`) and everything the tutorials
# and the tests need (the tests' client codebases and cross compiler:
# ci/test.sh). Sourced by the other scripts in ci/; safe to run again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "Creating .venv with $("$PYTHON" --version)"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.tfemb-installed
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
  echo "Installing tfemb and its dependencies into .venv (a few minutes the first time)"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[tensorflow,test,recommenders]"
  touch "$stamp"
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# The fused CPU kernels: compiled once per machine (~30 s), cached after;
# says which build is used, or why none (TensorFlow's ops are used then).
.venv/bin/python -m tfemb.kernels || true
