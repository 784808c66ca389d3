#!/usr/bin/env bash
# Installs Debian's C++ cross compiler for aarch64 (g++-aarch64-linux-gnu),
# with which tests/kernels/test_kernel_builds.py compiles the kernels for ARM.
# Needs root and apt-get; elsewhere it says so and the test is skipped
# (except under CI=true, where it fails). ci/test.sh calls this.
set -uo pipefail
if command -v aarch64-linux-gnu-g++ >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "No aarch64 cross compiler (apt-get install g++-aarch64-linux-gnu as" \
    "root): the ARM compile test is skipped"
  exit 0
fi
echo "Installing the aarch64 cross compiler (g++-aarch64-linux-gnu)"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends \
    g++-aarch64-linux-gnu; } >/tmp/tfemb-cross-compiler.log 2>&1; then
  echo "Installing the cross compiler failed (/tmp/tfemb-cross-compiler.log)"
fi
exit 0
