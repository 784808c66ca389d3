#!/usr/bin/env bash
# What CI runs. The whole test suite on the newest supported TensorFlow
# (.venv, ci/setup.sh), then the core tests on the oldest with the oldest
# supported Keras 3 (.venv-tf<OLDEST>, ci/setup_tf_version.sh): each twice,
# under Keras 3 (the default tf.keras) and under Keras 2 (tf_keras,
# TF_USE_LEGACY_KERAS=1), the two side by side on two cores or more
# (ci/passes.sh). Installs what it needs first.
#
# The core tests leave out the benchmarks and the slowest multi-process runs
# (the other tutorials, killed-and-resumed training, multi-worker and
# parameter-server clusters, Model Garden's models, the converter's
# command-line runs, the kernels' builds for every CPU and into a fresh or
# damaged cache: ci/setup_tf_version.sh has built them for that
# TensorFlow; the two-engine step repeated against a deadline; the
# engine's every-optimizer matrix under MirroredStrategy, where the Keras
# layer's mirrored tests stay; the export's mirrored tests; tfemb's
# keras-rs tests, the TPU programs run as 8-replica types and the keras-rs
# tutorial, where the in-process host TPU tests stay, and the host TPU
# under Keras;
# tfrs' checkpoints, the compat tutorial, `python -m tfemb.run` and
# `python -m tfemb.tpu`; the kernels' fallback cache and huge pages; two
# Keras layers in one model, one of the two optimizers fit under
# MirroredStrategy, two of the three exports at any batch size; the host
# engine's training, lookup, bad-input and all-or-nothing matrices on the
# fused kernels' paths, whose bits tests/kernels/test_one_bit_pattern.py
# checks against TensorFlow's ops on that TensorFlow, while its checkpoint
# and restore tests keep them), which the whole suite above covers; they
# keep the quickstart and the README's examples. There, the tests that use
# no Keras run in the Keras 3 pass only. `bash ci/test_tf_version.sh
# VERSION` runs everything on any version.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# aarch64's cross compiler, for tests/kernels/test_kernel_builds.py: apt-get
# installs it while pip installs the Python side.
cross_log="$(mktemp)"
bash ci/install_cross_compiler.sh > "$cross_log" 2>&1 &
cross=$!
source ci/setup.sh
bash ci/install_clients.sh          # Model Garden, for tests/test_model_garden.py
wait "$cross"  # never fails: without the compiler CI fails the ARM test
cat "$cross_log"
rm -f "$cross_log"
source ci/passes.sh

read_version() {  # <name> <file>: a version constant of a tfemb module
  sed -n "s/^$1 = \"\(.*\)\"$/\1/p" "$2"
}
oldest="$(read_version OLDEST tfemb/tf_versions.py)"
keras_min="$(read_version KERAS_MIN tfemb/layers/keras_versions.py)"
# The oldest TensorFlow's environment is installed while the newest's tests
# run: the install is mostly downloading and unpacking, which the tests'
# two cores leave room for.
oldest_setup_log="$(mktemp)"
( source ci/setup_tf_version.sh "$oldest" "$keras_min" ) \
  > "$oldest_setup_log" 2>&1 &
oldest_setup=$!

run_passes .venv/bin/python tests
echo "=== the whole suite passed under both Keras flavours ==="

echo "=== the core tests on TensorFlow $oldest with Keras $keras_min ==="
set +e; wait "$oldest_setup"; rc=$?; set -e
cat "$oldest_setup_log"
rm -f "$oldest_setup_log"
if [ "$rc" -ne 0 ]; then
  echo "installing TensorFlow $oldest failed (exit code $rc)"
  exit "$rc"
fi
source ci/setup_tf_version.sh "$oldest" "$keras_min"  # installed: sets TF_VENV
# The tests that use no Keras run in the Keras 3 pass only (tests/conftest.py).
TFEMB_KERAS_FREE_ONCE="$(echo tests/kernels/ tests/migrate/test_migrate.py \
  tests/test_configs.py tests/test_namespace.py \
  tests/host/test_{atomic_steps,bad_input,checkpoint,concurrency,heap}.py \
  tests/host/test_{initialization,lookup,ops_path,options}.py \
  tests/host/test_{restore_atomic,sparse_work,tf_scenarios,training}.py)" \
run_passes "$TF_VENV/bin/python" tests \
  --ignore=tests/benchmarks \
  --ignore=tests/layers/test_interrupted_training.py \
  --ignore=tests/strategies/test_multi_worker.py \
  --ignore=tests/strategies/test_parameter_server.py \
  --ignore=tests/strategies/test_cluster.py \
  --ignore=tests/test_model_garden.py \
  --ignore=tests/migrate/test_migrate_cli.py \
  --ignore=tests/kernels/test_kernel_builds.py \
  --ignore=tests/kernels/test_kernel_cache.py \
  --ignore=tests/strategies/test_mirrored.py \
  --ignore=tests/compat/test_keras_rs.py \
  --ignore=tests/tpu/test_host_tpu_programs.py \
  --deselect=tests/host/test_two_engines.py::test_the_combined_step_repeated_never_deadlocks \
  --deselect=tests/host/test_concurrency.py::test_asynchronous_parameter_server_workers_lose_no_update \
  --deselect=tests/test_tutorials.py::test_custom_training_loop \
  --deselect=tests/test_tutorials.py::test_tfrs_tutorial_under_keras_2 \
  --deselect=tests/test_tutorials.py::test_multi_worker_tutorial_launches_two_workers \
  --deselect=tests/test_tutorials.py::test_keras_rs_tutorial_trains_as_on_a_v5p_8 \
  --ignore=tests/layers/test_tfrs_checkpoint.py \
  --ignore=tests/compat/test_compat_tutorial.py \
  --ignore=tests/serving/test_export_mirrored.py \
  --deselect=tests/kernels/test_kernels.py::test_an_unwritable_home_falls_back_to_a_temporary_cache \
  --deselect=tests/kernels/test_kernels.py::test_tables_filled_in_blocks_are_on_huge_pages_before_any_step \
  --deselect=tests/test_patch.py::test_python_m_tfemb_run_runs_a_script_and_a_module \
  --deselect=tests/tpu/test_tpu_plan.py::test_python_dash_m_tfemb_tpu \
  --ignore=tests/tpu/test_host_tpu_keras.py \
  --deselect=tests/host/test_two_engines.py::test_two_keras_layers_in_one_model_train_as_each_alone \
  --deselect="tests/layers/test_layer_mirrored.py::test_fit_under_mirrored_equals_one_replica[adagrad]" \
  --deselect="tests/serving/test_export.py::test_served_at_any_batch_size_without_tfemb[model.export]" \
  --deselect="tests/serving/test_export.py::test_served_at_any_batch_size_without_tfemb[export_for_serving]" \
  -k "not ((test_training or test_lookup or test_bad_input or test_atomic_steps) and (fused or interleaved))"
echo "=== all tests passed under both Keras flavours, on the newest and" \
  "the oldest supported TensorFlow ==="
