"""Concurrent steps on one object lose no update (docs/numerics.md,
"Concurrent steps"): 4 threads train one object on every host path, eagerly
and in `tf.function`, and SGD's tables end where the serial sum of every
step's update puts them (an independent numpy reference)."""

import threading

import numpy as np
import pytest
import tensorflow as tf

import tfemb

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
  w = INIT.copy()
  for t in range(THREADS):
    ids, grads = thread_batch(t)
    for i, g in zip(ids, grads):
      w[i] -= STEPS * LR * g.astype(np.float64)
  return w


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
