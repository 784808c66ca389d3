#!/usr/bin/env bash
# Sourced with a TensorFlow version (e.g. 2.16) and optionally a Keras 3
# version: creates .venv-tf<VERSION> (once) with that TensorFlow, its
# tf-keras, and tfemb with what the tests need; sets TF_VENV to it. Without
# a Keras version, pip picks the newest that TensorFlow and tfemb accept.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tf_version="${1:?usage: source ci/setup_tf_version.sh VERSION [KERAS_VERSION]}"
keras_version="${2:-}"
PYTHON="${PYTHON:-python3}"
TF_VENV=".venv-tf$tf_version"
if [ ! -x "$TF_VENV/bin/python" ]; then
  echo "Creating $TF_VENV with $("$PYTHON" --version)"
  "$PYTHON" -m venv "$TF_VENV"
fi
wanted="tensorflow==$tf_version.* tf-keras==$tf_version.*${keras_version:+ keras==$keras_version}"
stamp="$TF_VENV/.tfemb-installed"
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ] ||
   [ "$(cat "$stamp")" != "$wanted" ]; then
  echo "Installing $wanted and tfemb into $TF_VENV (a few minutes the first time)"
  "$TF_VENV/bin/python" -m pip install --quiet --upgrade pip
  # shellcheck disable=SC2086  # $wanted is a list of requirements
  "$TF_VENV/bin/python" -m pip install --quiet -e ".[tensorflow,test,recommenders]" $wanted
  if [ -z "$keras_version" ]; then  # also when a pinned one was there
    "$TF_VENV/bin/python" -m pip install --quiet --upgrade keras
  fi
  echo "$wanted" > "$stamp"
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
"$TF_VENV/bin/python" -m tfemb.kernels
