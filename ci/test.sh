#!/usr/bin/env bash
# What CI runs. The whole test suite on the newest supported TensorFlow
# (.venv, ci/setup.sh), then the core tests on the oldest with the oldest
# supported Keras 3 (.venv-tf<OLDEST>, ci/setup_tf_version.sh): each twice,
# under Keras 3 (the default tf.keras) and under Keras 2 (tf_keras,
# TF_USE_LEGACY_KERAS=1), the two side by side on two cores or more
# (ci/passes.sh). Installs what it needs first.
#
# The core tests leave out the benchmarks and the tutorials, which run the
# same tfemb code as the rest; `bash ci/test_tf_version.sh VERSION` runs
# everything on any version.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source ci/setup.sh
source ci/passes.sh

run_passes .venv/bin/python tests
echo "=== the whole suite passed under both Keras flavours ==="

read_version() {  # <name> <file>: a version constant of a tfemb module
  sed -n "s/^$1 = \"\(.*\)\"$/\1/p" "$2"
}
oldest="$(read_version OLDEST tfemb/tf_versions.py)"
keras_min="$(read_version KERAS_MIN tfemb/layers/keras_versions.py)"
echo "=== the core tests on TensorFlow $oldest with Keras $keras_min ==="
source ci/setup_tf_version.sh "$oldest" "$keras_min"
run_passes "$TF_VENV/bin/python" tests \
  --ignore-glob='tests/test_benchmark_*' --ignore=tests/test_tutorials.py
echo "=== all tests passed under both Keras flavours, on the newest and" \
  "the oldest supported TensorFlow ==="
