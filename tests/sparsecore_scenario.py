"""The scenario of the SparseCore tests (tests/sparsecore/): three tables
on the host `TPUEmbeddingV2`, stacked as TensorFlow stacks them (two of
width 4 and one of width 3, all padded to 8 columns). A dense and a ragged
multi-hot feature share table "a" (mean), a weighted sparse feature looks
up "b" (sum), a dense feature "c" (sqrtn); ids repeat within and across
features. `batches` draws the ids and each activation's gradient (`coef`);
`rows` says where a table's ids sit in its stack."""

import numpy as np
import tensorflow as tf

import helpers
import reference
import tfemb

BATCH, STEPS = 4, 3
VOCAB = {"a": 20, "b": 12, "c": 9}
DIM = {"a": 4, "b": 4, "c": 3}


def initial_values(name):
  rng = np.random.default_rng(sum(map(ord, name)))
  return rng.normal(size=(VOCAB[name], DIM[name])).astype(np.float32)


def make(optimizer):
  tables = {n: tfemb.TableConfig(
      VOCAB[n], DIM[n], name=n, combiner=c,
      initializer=tf.constant_initializer(initial_values(n)))
            for n, c in (("a", "mean"), ("b", "sum"), ("c", "sqrtn"))}
  features = {
      "x": tfemb.FeatureConfig(tables["a"], output_shape=[BATCH]),
      "y": tfemb.FeatureConfig(tables["a"], output_shape=[BATCH]),
      "z": tfemb.FeatureConfig(tables["b"], output_shape=[BATCH]),
      "w": tfemb.FeatureConfig(tables["c"], output_shape=[BATCH]),
  }
  return tfemb.TPUEmbeddingV2(features, optimizer), features


def batches(seed):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(STEPS):
    y = helpers.random_rows(rng, BATCH, VOCAB["a"], 3, min_len=1)
    z = helpers.random_rows(rng, BATCH, VOCAB["b"], 4, min_len=1)
    out.append(dict(
        x=[[i] for i in rng.integers(0, VOCAB["a"], BATCH)], y=y, z=z,
        z_w=helpers.random_weights(rng, z),
        w=[[i] for i in rng.integers(0, VOCAB["c"], BATCH)],
        coef={k: rng.normal(size=(BATCH, DIM[t])) for k, t in
              (("x", "a"), ("y", "a"), ("z", "b"), ("w", "c"))}))
  return out


def inputs(b):
  features = {"x": tf.constant([r[0] for r in b["x"]], tf.int64),
              "y": helpers.ragged(b["y"]), "z": helpers.sparse(b["z"]),
              "w": tf.constant([r[0] for r in b["w"]], tf.int32)}
  weights = {"x": None, "y": None,
             "z": helpers.sparse(b["z"], b["z_w"], tf.float32), "w": None}
  return features, weights


def train(embedding, data, in_function):
  def one_step(features, weights, coef):
    activations, preserved = embedding(features, weights)
    embedding.apply_gradients(coef, preserved)
    return activations

  run = tf.function(one_step) if in_function else one_step
  for b in data:
    features, weights = inputs(b)
    run(features, weights, {k: tf.constant(v, tf.float32)
                            for k, v in b["coef"].items()})


_STRATEGIES = {}


def mirrored_strategy(n):
  """One strategy per size, with collective keys of its own (strategies of
  different sizes in one process must not share them; see
  tests/strategies/test_mirrored.py)."""
  if n not in _STRATEGIES:
    tf.distribute.MirroredStrategy._collective_key_base = 100_000 + 1000 * n  # pylint: disable=protected-access
    _STRATEGIES[n] = tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(n)])
  return _STRATEGIES[n]


def rows(layout_proto, vocabulary_size):
  """The stacked variable's row of each id of a table, by its
  `SparseCoreTableLayout` (the numpy reference's `stacked_rows`)."""
  return reference.stacked_rows(
      vocabulary_size, layout_proto.num_sparse_cores,
      layout_proto.sparse_core_shard_rotation,
      layout_proto.total_rows_per_sparse_core_shard,
      layout_proto.sparse_core_shard_row_offset)
