#!/usr/bin/env bash
# run_passes PYTHON PYTEST_ARGS...: pytest twice with PYTHON, under Keras 3
# (the default tf.keras) and under Keras 2 (tf_keras, TF_USE_LEGACY_KERAS=1);
# fails unless both pass. Sourced by ci/test.sh and ci/test_tf_version.sh.
#
# The two passes run side by side when the machine has two cores or more:
# a pass keeps about one core busy (most of a test is Python: tracing,
# Keras, subprocesses starting TensorFlow), so together they take about the
# time of one. Each pass writes its own log, printed whole when it ends.
# TFEMB_TEST_SERIAL=1 runs them one after the other, printing as they go.

PASSES=("Keras 3|TF_USE_LEGACY_KERAS=0"
        "tf_keras (TF_USE_LEGACY_KERAS=1)|TF_USE_LEGACY_KERAS=1")

verdict() {  # <label> <exit code>: fails the run unless pytest passed
  if [ "$2" -eq 5 ]; then
    echo "pytest collected no tests under $1: failing the run"
    exit 1
  fi
  if [ "$2" -ne 0 ]; then
    echo "tests failed under $1 (pytest exit code $2)"
    exit "$2"
  fi
}

run_passes() {  # <python> <pytest arguments...>
  local python="$1"; shift
  local label rc i
  if [ "${TFEMB_TEST_SERIAL:-0}" = 1 ] || [ "$(nproc)" -lt 2 ]; then
    for pass in "${PASSES[@]}"; do
      label="${pass%%|*}"
      echo "=== tests under $label ==="
      set +e; env "${pass#*|}" "$python" -m pytest -p no:cacheprovider "$@"
      rc=$?; set -e
      verdict "$label" "$rc"
    done
    return
  fi
  _logs="$(mktemp -d)"
  _pids=()
  _printed=0
  trap _stop_passes EXIT
  for i in "${!PASSES[@]}"; do
    env "${PASSES[$i]#*|}" "$python" -m pytest -p no:cacheprovider "$@" \
      > "$_logs/$i.log" 2>&1 &
    _pids+=("$!")
  done
  echo "=== tests under ${PASSES[0]%%|*} and ${PASSES[1]%%|*}, side by side ==="
  local codes=()
  for i in "${!PASSES[@]}"; do
    set +e; wait "${_pids[$i]}"; codes+=("$?"); set -e
    echo "=== tests under ${PASSES[$i]%%|*} ==="
    cat "$_logs/$i.log"
    _printed=$((i + 1))
  done
  trap - EXIT
  rm -rf "$_logs"
  for i in "${!PASSES[@]}"; do
    verdict "${PASSES[$i]%%|*}" "${codes[$i]}"
  done
}

_stop_passes() {  # at exit: stops the passes; shows what an interrupted one wrote
  kill "${_pids[@]}" 2>/dev/null || true
  for ((j = _printed; j < ${#_pids[@]}; j++)); do
    echo "=== tests under ${PASSES[$j]%%|*}: stopped before the end ==="
    cat "$_logs/$j.log"
  done
  rm -rf "$_logs"
}
