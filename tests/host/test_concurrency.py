"""Concurrent steps on one object lose no update (docs/numerics.md,
"Concurrent steps"): 4 threads train one object on every host path, eagerly
and in `tf.function`, and 3 asynchronous parameter-server workers train
one sharded table; SGD's tables end where the serial sum of every step's
update puts them (an independent numpy reference; exactly, for the
workers' integers)."""

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

import helpers
import ports
import reference
import tfemb
from workers import async_sgd_worker

THREADS = 4
STEPS = 40
VOCAB, DIM = 8, 4
LR = 0.01
INIT = np.linspace(-1.0, 1.0, VOCAB * DIM).reshape(VOCAB, DIM)


def thread_batch(t):
  """Thread t's ids (every thread touches rows 0..3) and gradients."""
  ids = np.array([0, 1, 2, 3, 4 + t % 4, 0], np.int64)
  grads = np.full((len(ids), DIM), 0.1 * (t + 1), np.float32)
  grads[:, 0] += np.arange(len(ids), dtype=np.float32)
  return ids, grads


def serial_sum():
  """SGD: every step subtracts lr * its summed row gradient."""
  # SGD is linear: STEPS steps of one gradient are one step at STEPS x LR.
  oracle = reference.Table(INIT, "sgd", {})
  for t in range(THREADS):
    ids, grads = thread_batch(t)
    oracle.apply(reference.row_gradients(zip(ids, grads)), STEPS * LR)
  return oracle.w


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_threads_lose_no_update(engine_path, mode):
  table = tfemb.TableConfig(VOCAB, DIM, name="t",
                            initializer=tf.constant_initializer(INIT))
  embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                 tfemb.SGD(LR))
  embedding.build()

  def step(ids, grads):
    embedding.enqueue({"f": ids}, training=True)
    embedding.dequeue()
    embedding.apply_gradients({"f": grads})

  if mode == "function":
    step = tf.function(step)
    ids, grads = thread_batch(0)  # traced once here; SGD: zeros change nothing
    step(tf.constant(ids), tf.zeros_like(grads))
  errors = []

  def work(t):
    ids, grads = thread_batch(t)
    ids, grads = tf.constant(ids), tf.constant(grads)
    try:
      for _ in range(STEPS):
        step(ids, grads)
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors
  np.testing.assert_allclose(embedding.embedding_tables["t"].numpy(),
                             serial_sum(), rtol=1e-5, atol=1e-5)


def test_asynchronous_parameter_server_workers_lose_no_update(tmp_path):
  """3 workers of a ParameterServerStrategy cluster (all on 127.0.0.1) run
  steps at once on one table sharded over 2 parameter servers, each shard
  updated under its server's lock only: the table is the initial one minus
  the sum of every step's gradients, to the last bit."""
  workers = helpers.WORKERS
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=os.pathsep.join(
                 [str(helpers.ROOT), str(workers),
                  os.environ.get("PYTHONPATH", "")]))
  with ports.reserved(5) as reserved:
    cluster = {"ps": [f"127.0.0.1:{p}" for p in reserved[:2]],
               "worker": [f"127.0.0.1:{p}" for p in reserved[2:]]}
    servers = [subprocess.Popen(
        [sys.executable, str(workers / "ps_worker.py"), "server",
         json.dumps(cluster), job, str(i)], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for job in ("ps", "worker") for i in range(len(cluster[job]))]
    try:
      out = tmp_path / "table.npy"
      result = subprocess.run(
          [sys.executable, str(workers / "async_sgd_worker.py"),
           "coordinator", json.dumps(cluster), str(out)],
          env=env, capture_output=True, text=True, timeout=300, check=False)
      assert result.returncode == 0, result.stderr[-4000:]
    finally:
      for server in servers:
        server.kill()
        server.wait()
  np.testing.assert_array_equal(np.load(out), async_serial_sum())


def async_serial_sum():
  """The workers' table had their steps run one after the other: SGD's
  reference applied to every step of `async_sgd_worker` in turn."""
  oracle = reference.Table(async_sgd_worker.INIT, "sgd", {})
  for s in range(async_sgd_worker.STEPS):
    ids, grads = async_sgd_worker.batch(s)
    oracle.apply(reference.row_gradients(zip(ids, grads)),
                 async_sgd_worker.LR)
  return oracle.w
