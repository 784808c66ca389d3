"""Two embedding objects stepped in one function
(tests/host/test_two_engines.py).

`python two_engines_worker.py STEPS` repeats the combined step of every
pair of engines STEPS times and prints each pair's name when it is done.
"""

import sys

import numpy as np
import tensorflow as tf

import tfemb
from tfemb.sparsecore import table_stacking

BATCH, VOCAB, DIM, STEPS, LR = 8, 20, 4, 3, 0.5
RNG = np.random.default_rng(3)
INIT = RNG.normal(size=(VOCAB, DIM))
IDS = RNG.integers(0, VOCAB, size=(STEPS, BATCH))
GRADS = RNG.normal(size=(STEPS, BATCH, DIM)).astype(np.float32)
KINDS = {"v1": tfemb.TPUEmbedding, "v2": tfemb.TPUEmbeddingV2}
PAIRS = [("v1", "v1"), ("v2", "v2"), ("v1", "v2")]


def make(kind, name, batch=BATCH):
  table = tfemb.TableConfig(VOCAB, DIM, name=name,
                            initializer=tf.constant_initializer(INIT))
  feature = tfemb.FeatureConfig(table, name="f", output_shape=[batch])
  engine = KINDS[kind]({"f": feature}, tfemb.Adagrad(LR))
  engine.build()
  return engine


def look_up(engine, ids):
  """The activations and the function that applies their gradients."""
  if isinstance(engine, tfemb.TPUEmbeddingV2):
    activations, preserved = engine({"f": ids})
    return activations, lambda g: engine.apply_gradients(g, preserved)
  engine.enqueue({"f": ids}, training=True)
  return engine.dequeue(), engine.apply_gradients


def step_together(engines):
  @tf.function
  def step(ids, grads):
    appliers = []
    for engine in engines:
      activations, apply = look_up(engine, ids)
      appliers.append(apply)
      del activations
    for apply in appliers:
      apply({"f": grads})
  return step


def step_alone(engine):
  @tf.function
  def step(ids, grads):
    _, apply = look_up(engine, ids)
    apply({"f": grads})
  return step


def parameters(engine):
  """The table, unstacked where the SparseCore stacks it."""
  if isinstance(engine, tfemb.TPUEmbeddingV2):
    (table,) = [v for v in engine.embedding_tables.values()]
    stacking = engine._stacking  # pylint: disable=protected-access
    (name,) = list(engine.embedding_tables)
    return next(iter(table_stacking.to_unstacked(
        stacking, {name: table.numpy()}).values()))
  (table,) = engine.embedding_tables.values()
  return table.numpy()



def main(steps):
  for pair in PAIRS:
    engines = [make(kind, f"t{i}") for i, kind in enumerate(pair)]
    step = step_together(engines)
    for s in range(steps):
      step(IDS[s % STEPS], GRADS[s % STEPS])
    print("+".join(pair), "done", flush=True)


if __name__ == "__main__":
  main(int(sys.argv[1]))
