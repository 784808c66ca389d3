"""A Keras 3 subclassed model (tests/workers/subclassed_fit_worker.py), its
embedding made in `__init__` and built by `fit` from symbolic float inputs,
trains on a host SparseCore TPU, in a process of its own (`python -m
tfemb.run --tpu TYPE`): with tfemb's layer and with keras-rs'
`DistributedEmbedding`, each epoch's loss and the table after `fit` are
tests/reference.py's on the global batch, and no epoch after the first
traces a function (docs/tpu.md, "Datasets")."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import helpers
import reference

WORKER = str(helpers.WORKERS / "subclassed_fit_worker.py")
EPOCHS, GLOBAL_BATCH, LR = 3, 16, 0.3
# keras-rs is Keras 3's; the worker's process is Keras 3 in either pass.
pytestmark = [pytest.mark.runs_under("keras3"),
              pytest.mark.requires_tensorflow("2.17")]


def _expected(result):
  """The table after EPOCHS epochs of Adagrad on `pred = sum(row)` (MSE
  over the global batch), and each epoch's mean loss."""
  table = reference.Table(np.asarray(result["init"]), "adagrad",
                          {"initial_accumulator_value": 0.1})
  ids, labels = np.asarray(result["ids"]), np.asarray(result["labels"])
  losses = []
  for _ in range(EPOCHS):
    epoch = []
    for start in range(0, len(ids), GLOBAL_BATCH):
      batch, y = ids[start:start + GLOBAL_BATCH], labels[start:start +
                                                         GLOBAL_BATCH]
      pred = table.w[batch].sum(axis=1)
      epoch.append(reference.mean_squared_error(y, pred))
      grad = 2 * (pred - y) / GLOBAL_BATCH
      table.apply(reference.row_gradients(
          [(i, np.full(table.w.shape[1], g)) for i, g in zip(batch, grad)]),
                  LR)
    losses.append(np.mean(epoch))
  return table.w, losses


@pytest.mark.parametrize("tpu", ["v5p-8", "v6e-8"])
def test_a_subclassed_keras_3_model_fits_on_a_host_sparsecore_tpu(tpu):
  done = subprocess.run(
      [sys.executable, "-m", "tfemb.run", "--tpu", tpu, WORKER,
       "tfemb,keras_rs", str(EPOCHS), "tpu"],
      capture_output=True, text=True, timeout=900, cwd=helpers.ROOT,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="0"))
  assert done.returncode == 0, done.stderr[-4000:]
  results = [json.loads(line) for line in done.stdout.splitlines()
             if line.startswith("{")]
  assert [r["kind"] for r in results] == ["tfemb", "keras_rs"]
  for result in results:
    table, losses = _expected(result)
    np.testing.assert_allclose(result["loss"], losses, rtol=1e-5,
                               err_msg=result["kind"])
    stacked = np.asarray(result["table"])
    shards = result["shards"]
    vocab, dim = table.shape
    got = stacked[reference.stacked_rows(vocab, shards, 0,
                                         stacked.shape[0] // shards, 0), :dim]
    np.testing.assert_allclose(got, table, rtol=1e-5, atol=1e-6,
                               err_msg=result["kind"])
    # The first epoch traces the step; the next ones trace nothing (no
    # function appears in TensorFlow's eager context during them).
    assert result["traced"][0], result["kind"]
    assert result["traced"][1:] == [[]] * (EPOCHS - 1), result["kind"]
