"""Two embedding objects stepped in one function train as if stepped one
after the other, and never deadlock (docs/architecture.md, "The update
lock").

Each engine updates under a lock of its own; in one traced function the
updates run in the order they are written. Checked for two first-generation
engines, two SparseCore engines, one of each, under MirroredStrategy, and
for two Keras layers in one model; a subprocess repeats the combined step
many times under a deadline.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
import tfemb.layers
from workers import two_engines_worker as worker
from workers.two_engines_worker import BATCH, DIM, GRADS, IDS, INIT, LR
from workers.two_engines_worker import STEPS, VOCAB

PAIRS = worker.PAIRS
WORKER = helpers.WORKERS / "two_engines_worker.py"
ROOT = helpers.ROOT

def expected():
  ref = reference.Table(INIT, "adagrad", {})
  for s in range(STEPS):
    ref.apply(reference.row_gradients(reference.contributions(
        IDS[s][:, None], "sum", GRADS[s])), LR)
  return ref.w


@pytest.mark.requires_tensorflow("2.17")
@pytest.mark.parametrize("pair", PAIRS, ids="+".join)
def test_two_engines_in_one_step_equal_each_stepped_alone(pair):
  together = [worker.make(kind, f"t{i}") for i, kind in enumerate(pair)]
  alone = [worker.make(kind, f"u{i}") for i, kind in enumerate(pair)]
  step = worker.step_together(together)
  singles = [worker.step_alone(e) for e in alone]
  for s in range(STEPS):
    step(IDS[s], GRADS[s])
    for single in singles:
      single(IDS[s], GRADS[s])
  want = expected()
  for a, b in zip(together, alone):
    np.testing.assert_array_equal(worker.parameters(a), worker.parameters(b))
    np.testing.assert_allclose(worker.parameters(a), want, rtol=1e-5, atol=1e-6)


def test_two_engines_under_mirrored_strategy_equal_one_replica():
  # Collective keys of its own (strategies in one process must not share
  # them: tests/strategies/test_mirrored.py).
  tf.distribute.MirroredStrategy._collective_key_base = 40_000  # pylint: disable=protected-access
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  half = BATCH // 2
  with strategy.scope():
    engines = [worker.make("v1", "a", half), worker.make("v1", "b", half)]

  @tf.function
  def step(ids, grads):
    def replica(ids, grads):
      appliers = []
      for engine in engines:
        engine.enqueue({"f": ids}, training=True)
        engine.dequeue()
        appliers.append(engine.apply_gradients)
      for apply in appliers:
        apply({"f": grads})
    strategy.run(replica, args=(ids, grads))

  for s in range(STEPS):
    # Each replica takes its half of the global batch.
    ids = strategy.experimental_distribute_values_from_function(
        lambda ctx, s=s: IDS[s][ctx.replica_id_in_sync_group * half:][:half])
    grads = strategy.experimental_distribute_values_from_function(
        lambda ctx, s=s: GRADS[s][ctx.replica_id_in_sync_group * half:][:half])
    step(ids, grads)
  want = expected()
  for engine in engines:
    (table,) = engine.embedding_tables.values()
    for copy in table.values:
      np.testing.assert_allclose(copy.numpy(), want, rtol=1e-5, atol=1e-6)


def test_two_keras_layers_in_one_model_train_as_each_alone():
  keras = tf.keras

  def layer(name):
    table = tfemb.TableConfig(VOCAB, DIM, name=name,
                              initializer=tf.constant_initializer(INIT))
    return tfemb.layers.TPUEmbedding(
        {"f": tfemb.FeatureConfig(table, name="f")}, tfemb.Adagrad(LR))

  ids = keras.Input(shape=(1,), dtype=tf.int32, name="f")
  first, second = layer("a"), layer("b")
  out = keras.layers.Concatenate()([first({"f": ids})["f"],
                                    second({"f": ids})["f"]])
  model = keras.Model({"f": ids}, out)
  # The loss's gradient at each layer's activations is its half of the
  # target, over the batch: sum(out * target) / batch.
  model.compile(keras.optimizers.SGD(0.1),
                lambda y, p: tf.reduce_sum(p * y, axis=-1))
  target = np.concatenate([GRADS.reshape(-1, DIM)] * 2, axis=-1) * BATCH
  model.fit({"f": IDS.reshape(-1, 1)}, target, batch_size=BATCH, epochs=1,
            shuffle=False, verbose=0)
  want = expected()
  for embedding in (first, second):
    (table,) = embedding.embedding_tables.values()
    np.testing.assert_allclose(table.numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.requires_tensorflow("2.17")
@pytest.mark.runs_under("keras3")
def test_the_combined_step_repeated_never_deadlocks():
  """Before the fix, most runs hung within the first three calls."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="0",
             PYTHONPATH=str(ROOT))
  try:
    result = subprocess.run([sys.executable, str(WORKER), "150"], env=env,
                            capture_output=True, text=True, timeout=300,
                            check=False)
  except subprocess.TimeoutExpired as e:
    pytest.fail(f"the combined step deadlocked: {e.stdout}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split("\n")[:3] == [
      "v1+v1 done", "v2+v2 done", "v1+v2 done"]
