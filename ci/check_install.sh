#!/usr/bin/env bash
# Installing tfemb never installs a second TensorFlow. In fresh venvs (in a
# temporary directory, removed at the end), one per way of installing:
#   beside tensorflow-cpu, and beside tensorflow, installed first;
#   on a fresh machine with the extras: tfemb[cpu], tfemb[tensorflow];
# each must leave `pip check` clean, exactly one distribution providing the
# `tensorflow` package, and `import tfemb` working.
#
#   bash ci/check_install.sh [TF_VERSION]   # default: NEWEST in tfemb/tf_versions.py
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd)"
PYTHON="${PYTHON:-python3}"
version="${1:-$(sed -n 's/^NEWEST = "\(.*\)"$/\1/p' tfemb/tf_versions.py)}"
work="$(mktemp -d)"
# Building tfemb leaves build/ in the clone; removed unless it was there.
had_build="$([ -e build ] && echo yes || true)"
trap 'rm -rf "$work"; [ -n "$had_build" ] || rm -rf build' EXIT

# Prints each installed distribution that provides the `tensorflow` package.
count_tensorflows='
import importlib.metadata as md
for dist in md.distributions():
  if any(str(f) == "tensorflow/__init__.py" for f in dist.files or ()):
    print(dist.metadata["Name"], dist.version)
'

check() {  # <label> <pip install arguments, first step> [; second step]
  local label="$1" venv="$work/venv-$2"
  shift 2
  echo "=== $label ==="
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  local step=()
  for arg in "$@" ";"; do
    if [ "$arg" = ";" ]; then
      "$venv/bin/python" -m pip install --quiet "${step[@]}"
      step=()
    else
      step+=("$arg")
    fi
  done
  "$venv/bin/python" -m pip check
  local found
  found="$("$venv/bin/python" -c "$count_tensorflows")"
  echo "TensorFlow distributions: ${found//$'\n'/, }"
  if [ "$(grep -c . <<< "$found")" -ne 1 ]; then
    echo "FAILED: $label: expected exactly one TensorFlow"
    exit 1
  fi
  (cd "$work" && TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/python" -c \
    "import tfemb, tensorflow as tf; print('import tfemb: ok, TensorFlow', tf.__version__)")
}

check "tfemb beside tensorflow-cpu" beside-cpu \
  "tensorflow-cpu==$version.*" ";" "$repo"
check "tfemb beside tensorflow" beside-tensorflow \
  "tensorflow==$version.*" ";" "$repo"
check "tfemb[cpu] on a fresh machine" extra-cpu \
  "$repo[cpu]" "tensorflow-cpu==$version.*"
check "tfemb[tensorflow] on a fresh machine" extra-tensorflow \
  "$repo[tensorflow]" "tensorflow==$version.*"
echo "=== every install left one TensorFlow and a clean pip check ==="
