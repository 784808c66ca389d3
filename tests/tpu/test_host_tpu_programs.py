"""An unmodified TPU program (tests/workers/tpu_program.py) on the CPU as
each TPU type of 8 replicas, in a process of its own: `python -m tfemb.run
--tpu TYPE`, or `TFEMB_TPU=TYPE` for a runner that calls `tfemb.patch()`.
Its two SGD steps over 8 replicas equal tests/reference.py on the global
batch; a V0 program (no embedding hardware) looks its rows up."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import helpers
import reference

PROGRAM = str(helpers.WORKERS / "tpu_program.py")
# The same program behind a TPU VM's preamble (`import libtpu`, the TPU
# runtime's variables), with the variables in its environment too.
TPU_VM_PROGRAM = str(helpers.WORKERS / "tpu_vm_program.py")
TPU_VM_ENVIRONMENT = {"PJRT_DEVICE": "TPU",
                      "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
                      "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/lib/libtpu.so",
                      "TF_XLA_FLAGS": "--tf_mlir_enable_mlir_bridge=true"}
# The program uses no Keras: the same work in both passes, so it runs in
# one (`runs_under`), the Keras 3 pass, which has room for it.
pytestmark = [pytest.mark.runs_under("keras3")]


def _run(args, env=None):
  done = subprocess.run(
      [sys.executable] + args, capture_output=True, text=True, timeout=600,
      cwd=helpers.ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                                 **(env or {})))
  return done


def _result(done):
  assert done.returncode == 0, done.stderr[-4000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def _expected_table(result):
  init = np.asarray(result["init"], np.float64)
  table = reference.Table(init, "sgd", {})
  for ids, coef in zip(result["ids"], np.asarray(result["coef"])):
    table.apply(reference.row_gradients(zip(ids, coef)), 0.5)
  return table.w


@pytest.mark.parametrize("tpu,feature,cores,engine", [
    pytest.param("v6e-8", "V2", 2, "tfemb.sparsecore.engine.TPUEmbeddingV2",
                 marks=pytest.mark.requires_tensorflow("2.17")),
    ("v2-8", "V1", 0, "tfemb.mid_level.TPUEmbedding"),
    ("v5litepod-8", "UNSUPPORTED", 0, "tfemb.v0.TPUEmbeddingV0"),
])
def test_a_tpu_program_runs_as_the_type(tpu, feature, cores, engine):
  if tpu == "v2-8":  # as a test runner sets it
    done = _run(["-m", "tfemb.run", PROGRAM], env={"TFEMB_TPU": tpu})
  elif tpu == "v6e-8":  # a TPU VM program, as Cloud TPU's guides write it
    done = _run(["-m", "tfemb.run", "--tpu", tpu, TPU_VM_PROGRAM],
                env=TPU_VM_ENVIRONMENT)
  else:
    done = _run(["-m", "tfemb.run", "--tpu", tpu, PROGRAM])
  result = _result(done)
  assert result["tpu_strategy"] and result["replicas"] == 8
  assert (result["feature"], result["sparse_cores_per_chip"],
          result["engine"]) == (feature, cores, engine)
  init = np.asarray(result["init"])
  first_ids = np.asarray(result["ids"][0])
  # (V0 keeps a dense input's [batch, 1] shape, as TensorFlow's.)
  np.testing.assert_allclose(
      np.asarray(result["first_activations"]).reshape(16, 4),
      init[first_ids], rtol=1e-6)
  table = np.asarray(result["table"])
  if feature == "UNSUPPORTED":  # V0 trains with Keras, not in this loop
    np.testing.assert_array_equal(table, init.astype(np.float32))
    return
  if feature == "V2":
    assert result["shards"] == 8  # one per chip
    n = 8 * cores
    table = table[reference.stacked_rows(32, n, 0, table.shape[0] // n, 0),
                  :4]
  np.testing.assert_allclose(table, _expected_table(result), rtol=1e-5,
                             atol=1e-6)


@pytest.mark.parametrize("tpu", ["v3-8", "v5p-8"])
def test_an_iterator_made_in_a_function_reads_every_replicas_batch(tpu):
  """Made inside a `tf.function`, TensorFlow's per-replica iterator blocks
  a thread of TensorFlow's inter-op pool per replica: with the 2 threads
  of a 2-core host and 8 replicas, the program stopped for good. The host
  TPU's iterators of both kinds read one host iterator there too
  (tfemb/tpu/host/datasets.py): each replica gets the batch TensorFlow
  deals it, replica k the k-th."""
  done = _run(["-m", "tfemb.run", "--tpu", tpu,
               str(helpers.WORKERS / "iterator_in_function.py")],
              env={"TF_NUM_INTEROP_THREADS": "2"})
  result = _result(done)
  n = result["replicas"]
  assert n == {"v3-8": 8, "v5p-8": 4}[tpu]
  assert result["inter_op_threads"] == "2"
  # The program's datasets: range(4n) in global batches of 2n (split in
  # order) and in batches of 2 (dealt out in turn).
  elements = range(4 * n)
  want = reference.dealt_batches(elements, n, 2, steps=2)
  assert result["dataset"] == want
  assert result["from_function"] == want


def test_an_unknown_type_fails_before_the_program():
  done = _run(["-m", "tfemb.run", "--tpu", "v9-8", PROGRAM])
  assert done.returncode == 2
  assert "Unknown TPU type 'v9-8'" in done.stderr
  assert "v5p-8" in done.stderr and "v6e-8" in done.stderr
