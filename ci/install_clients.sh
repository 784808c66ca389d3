#!/usr/bin/env bash
# Installs the real client codebases the tests run tfemb under (into .venv):
# TensorFlow Model Garden's ranking code (tf-models-official, without its
# pinned TensorFlow and heavy extras), and what that code imports.
# tests/test_model_garden.py runs when it is installed; ci/setup.sh calls
# this. Safe to run again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
if ! "$PY" -c "import official.recommendation.ranking" 2>/dev/null; then
  "$PY" -m pip install --quiet --no-deps "tf-models-official==2.19.1"
  "$PY" -m pip install --quiet "gin-config>=0.5" "pyyaml>=6" "etils>=1.5" \
    "toml" "promise" "tensorflow-metadata" "immutabledict"
  "$PY" -m pip install --quiet --no-deps "tensorflow-datasets==4.9.9"
fi
