#!/usr/bin/env bash
# Release check: the whole test suite on one TensorFlow version, under both
# Keras flavours, in its own .venv-tf<VERSION> (ci/setup_tf_version.sh):
#
#   bash ci/test_tf_version.sh 2.18             # every test
#   KERAS=3.6.0 bash ci/test_tf_version.sh 2.16 # with that Keras 3
#   bash ci/test_tf_version.sh 2.16 tests/host/test_training.py   # some tests
#
# The supported range is OLDEST to NEWEST in tfemb/tf_versions.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
version="${1:?usage: bash ci/test_tf_version.sh VERSION [pytest arguments]}"
shift
source ci/setup_tf_version.sh "$version" "${KERAS:-}"
source ci/passes.sh
run_passes "$TF_VENV/bin/python" "${@:-tests}"
echo "=== all tests passed under both Keras flavours on TensorFlow $version ==="
