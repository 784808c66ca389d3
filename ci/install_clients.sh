#!/usr/bin/env bash
# Installs the real client codebases the tests run tfemb under: TensorFlow
# Model Garden's ranking code (tf-models-official, without its pinned
# TensorFlow and heavy extras) and what that code imports, into
# .venv/clients, a directory of their own that tests/test_model_garden.py
# puts on its worker's path. .venv itself stays as the quickstart leaves it
# (`pip check` clean: Model Garden declares requirements it does not use).
# ci/test.sh calls this. Safe to run again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
CLIENTS=.venv/clients
if [ ! -d "$CLIENTS/official/recommendation/ranking" ]; then
  echo "Installing Model Garden's ranking code into $CLIENTS (for one test)"
  "$PY" -m pip install --quiet --no-deps --target "$CLIENTS" \
    "tf-models-official==2.19.1" "tensorflow-datasets==4.9.9" \
    "gin-config>=0.5" "pyyaml>=6" "etils>=1.5" "toml" "promise" \
    "tensorflow-metadata" "immutabledict" "googleapis-common-protos"
fi
