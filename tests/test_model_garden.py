"""A real TPU client, unchanged: TensorFlow Model Garden's ranking task
(`official.recommendation.ranking`, tf-models-official) under
`tfemb.patch()`, with tf_keras as Model Garden needs. Each run trains an
experiment's model (small tables, Model Garden's synthetic data) and checks
that its tables are tfemb's and move, that the embedding optimizer's
learning rate is Model Garden's schedule at every step, that the loss on
a held batch falls and that a checkpoint restores; on the TPU branch, that
the model trained from the CPU path's start ends with the CPU path's
tables, weights and predictions (tests/workers/model_garden_worker.py).

Model Garden is installed by `ci/install_clients.sh` (ci/test.sh runs it)
into a directory of its own beside the interpreter's packages (CLIENTS),
which the worker gets on its path; without it this file fails to load.
"""

import json
import os
import math
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "workers", "model_garden_worker.py")
CLIENTS = os.path.join(sys.prefix, "clients")

if not os.path.isdir(os.path.join(CLIENTS, "official", "recommendation")):
  raise RuntimeError(f"Model Garden is not installed in {CLIENTS}: run "
                     "ci/install_clients.sh (ci/test.sh, the README's test "
                     "command, does).")


# Model Garden's code runs on tf_keras whatever the pass: the same work in
# both passes, so it runs in the tf_keras one (`runs_under`).
@pytest.mark.runs_under("tf_keras")
@pytest.mark.parametrize("experiment,strategy", [
    # The default strategy's runs in the long suite (the suite's time): CI's
    # TPU case trains DLRM on the CPU path too, beside its TPU branch.
    pytest.param("dlrm_criteo", "default", marks=pytest.mark.long),
    pytest.param("dlrm_dcn_v2_criteo", "default", marks=pytest.mark.long),
    # Several replicas in CI: the TPU case's 4; MirroredStrategy's 2 in the
    # long suite.
    pytest.param("dlrm_criteo", "mirrored", marks=pytest.mark.long),
    # `distribution_strategy: tpu`: Model Garden's own TPU set-up gives the
    # host v5p-8's TPUStrategy, and its TPU branch (the SparseCore's
    # per-replica output shapes and config) trains on tfemb's host
    # TPUEmbeddingV2.
    pytest.param("dlrm_criteo", "tpu",
                 marks=pytest.mark.requires_tensorflow("2.17")),
])
def test_model_garden_trains_on_tfemb(experiment, strategy, tmp_path):
  env = dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=os.pathsep.join(
                 [ROOT, CLIENTS, os.environ.get("PYTHONPATH", "")]))
  done = subprocess.run([sys.executable, WORKER, experiment, strategy,
                         str(tmp_path)], capture_output=True, text=True,
                        env=env, timeout=600, check=False)
  assert done.returncode == 0, done.stderr[-4000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["layer"] == "tfemb.layers.embedding_layer.TPUEmbedding"
  assert result["replicas"] == {"mirrored": 2, "tpu": 4}.get(strategy, 1)
  assert result["tpu_strategy"] == (strategy == "tpu")
  assert result["engine"] == ("TPUEmbeddingV2" if strategy == "tpu" else
                              "TPUEmbedding")
  assert len(result["moved"]) == 4 and min(result["moved"].values()) > 0
  for ours, model_gardens in result["rates"]:  # step by step
    assert ours == pytest.approx(model_gardens, rel=1e-6)
  assert all(map(math.isfinite, result["losses"]))
  before, after = result["held_loss"]  # one batch, before and after training
  assert after < before
  assert result["restored"]
  twin = result["cpu_twin"]
  if strategy == "tpu":
    # The TPU branch and the CPU path from the same start on the same 8
    # batches: the tables moved, and end equal, as do the dense weights and
    # the predictions of a batch (float32 sums in another order: 4
    # replicas' gradients all-reduced).
    assert twin["tables_moved"] > 1e-3
    assert twin["tables"] < 1e-6 and twin["dense"] < 1e-6
    assert twin["predicted"] == 64 and twin["predictions"] < 1e-6
    assert all(map(math.isfinite, twin["losses"]["tpu"]))
  else:
    assert twin is None
