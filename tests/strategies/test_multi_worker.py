"""MultiWorkerMirroredStrategy: two worker processes on 127.0.0.1 train
with the Keras layer and end with the tables of one process on the same
global batch.

`model.fit` runs under tf_keras: Keras 3.15's fit cannot start under
MultiWorkerMirroredStrategy (its `_maybe_symbolic_build` strategy.reduce
of the first batch fails, whatever the model). Under Keras 3 the workers
train the same model in a GradientTape loop inside `strategy.run`.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import helpers
import ports

WORKER = helpers.WORKERS / "fit_worker.py"
ROOT = helpers.ROOT


def launch(out, mode, legacy_keras, tf_config=None, worker=WORKER):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             TF_USE_LEGACY_KERAS="1" if legacy_keras else "0",
             PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get(
                 "PYTHONPATH", ""))
  env.pop("TF_CONFIG", None)
  if tf_config is not None:
    env["TF_CONFIG"] = json.dumps(tf_config)
  return subprocess.Popen([sys.executable, str(worker), str(out)] +
                          ([mode] if mode else []),
                          env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)


def finish(process):
  try:
    stdout, stderr = process.communicate(timeout=300)
  except subprocess.TimeoutExpired:
    process.kill()
    raise
  assert process.returncode == 0, stderr[-4000:]
  return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode,legacy_keras", [
    pytest.param("fit", True, id="model.fit-tf_keras",
                 marks=pytest.mark.runs_under("tf_keras")),
    pytest.param("loop", False, id="tape_loop-keras3",
                 marks=pytest.mark.runs_under("keras3"))])
def test_two_workers_equal_one_process(tmp_path, mode, legacy_keras):
  with ports.reserved(2) as reserved:
    cluster = {"worker": [f"127.0.0.1:{p}" for p in reserved]}
    workers = [
        launch(tmp_path / f"worker{i}.npz", mode, legacy_keras,
               {"cluster": cluster, "task": {"type": "worker", "index": i}})
        for i in range(2)
    ]
    single = launch(tmp_path / "single.npz", mode, legacy_keras)
    results = [finish(p) for p in workers]
  assert [r["replicas"] for r in results] == [2, 2]
  assert finish(single)["replicas"] == 1
  expected = np.load(tmp_path / "single.npz")
  for i in range(2):
    got = np.load(tmp_path / f"worker{i}.npz")
    assert set(got.files) == {"parameters", "accumulators"}
    for name in expected.files:
      np.testing.assert_allclose(got[name], expected[name], rtol=1e-5,
                                 atol=1e-6, err_msg=f"worker {i}: {name}")
  assert not np.allclose(expected["accumulators"], 0.1)


# The workers use no Keras: the same work in both passes, so it runs in one,
# the tf_keras pass, which has room for it.
@pytest.mark.runs_under("tf_keras")
def test_two_workers_train_tpu_embedding_v2_on_the_global_batch(tmp_path):
  """The host TPUEmbeddingV2 under MultiWorkerMirroredStrategy (2 processes,
  each laid out for 2 chips), its tables created in its first lookup inside
  strategy.run, ends with the tables and Adagrad slots of one process
  (laid out for 1 chip) on the same global batches: the update is applied
  once to the global batch's summed gradient. So does a first-generation
  TPUEmbedding beside it ("v1/"), and one whose every id is dropped
  ("dropped/"), though a table gets no id on any replica in some steps and
  none on one replica in others (tests/workers/v2_worker.py)."""
  worker = WORKER.parent / "v2_worker.py"
  with ports.reserved(2) as reserved:
    cluster = {"worker": [f"127.0.0.1:{p}" for p in reserved]}
    workers = [
        launch(tmp_path / f"worker{i}.npz", None, False,
               {"cluster": cluster, "task": {"type": "worker", "index": i}},
               worker)
        for i in range(2)
    ]
    single = launch(tmp_path / "single.npz", None, False, worker=worker)
    results = [finish(p) for p in workers]
  alone = finish(single)
  assert [r["replicas"] for r in results] == [2, 2]
  assert alone["replicas"] == 1
  dropped = alone["dropped"]["extra_items_users"]
  assert dropped > 0
  assert sum(r["dropped"]["extra_items_users"] for r in results) == dropped
  expected = np.load(tmp_path / "single.npz")
  assert sorted(expected.files) == sorted(
      f"{engine}{table}/{slot}" for engine in ("", "v1/", "dropped/")
      for table in ("extra", "items", "users")
      for slot in ("accumulators", "parameters"))
  for i in range(2):
    got = np.load(tmp_path / f"worker{i}.npz")
    for name in expected.files:
      np.testing.assert_allclose(got[name], expected[name], rtol=1e-5,
                                 atol=1e-6, err_msg=f"worker {i}: {name}")
  for engine in ("", "v1/"):
    assert not np.allclose(expected[f"{engine}extra/accumulators"], 0.1)
  for table in ("extra", "items", "users"):
    np.testing.assert_array_equal(expected[f"dropped/{table}/accumulators"],
                                  np.float32(0.1))
