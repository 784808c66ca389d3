#!/usr/bin/env bash
# The main job: installs tfemb (first time only) and runs the quickstart
# tutorial, which trains a recommender on the CPU and saves a checkpoint.
#
# TensorFlow's C++ start-up lines (oneDNN's notice; the CUDA probe of the
# `tensorflow` build on a machine without a GPU, which it logs as an
# error) are left out of the output; TFEMB_QUICKSTART_TF_LOG=1 shows them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "${TFEMB_QUICKSTART_TF_LOG:-0}" != 1 ]; then
  exec 2> >(grep --line-buffered -v -E \
    '^WARNING: All log messages before absl::InitializeLog|^[IWE][0-9]{4} [0-9:.]+ +[0-9]+ (port|cudart_stub|cuda_platform|cuda_executor|cuda_diagnostics)\.cc:' >&2)
fi
source ci/setup.sh
.venv/bin/python tutorials/quickstart.py "$@"
