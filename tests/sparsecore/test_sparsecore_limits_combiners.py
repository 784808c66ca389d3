"""`CustomCombiner` features under a `SparseCoreEmbeddingConfig`'s id limits
(docs/sparsecore.md, "Id limits"): their ids are not counted, alone or
beside counted features, on the fused kernels and on TensorFlow's ops; the
tables after two steps are tests/reference.py's."""

import numpy as np
import pytest
import tensorflow as tf

import reference
import tfemb
from tfemb import options
from tfemb.sparsecore import table_stacking

pytestmark = pytest.mark.requires_tensorflow("2.17")

VOCAB, DIM, SAMPLES, VALENCY, LR = 16, 4, 8, 2, 0.5
INIT = {name: np.random.default_rng(seed).uniform(-1, 1, (VOCAB, DIM))
        for seed, name in enumerate("cs")}
# Ids 0, 4, 8 of every sample go to partition 0 of the one chip's 4: were
# they counted, each SparseCore would send it 4 ids (2 samples x the
# combiner's first 2), over the stack's limit of 2.
CUSTOM_ROWS = [[0, 4, 8]] * SAMPLES
COUNTED_ROWS = [[k] for k in range(SAMPLES)]  # one id per cell
LIMIT = 2


def _first_ids_summed(valency, vectors):
  mask = tf.range(vectors.shape[0]) < valency
  return tf.reduce_sum(tf.where(mask[:, None], vectors,
                                tf.zeros_like(vectors)), axis=0)


def _engine(mixed):
  table = lambda name, combiner: tfemb.TableConfig(
      VOCAB, DIM, name=name, combiner=combiner,
      initializer=tf.constant_initializer(INIT[name]))
  features = {"custom": tfemb.FeatureConfig(
      table("c", tfemb.CustomCombiner(_first_ids_summed, VALENCY)),
      output_shape=[SAMPLES])}
  if mixed:
    features["counted"] = tfemb.FeatureConfig(table("s", "sum"),
                                              output_shape=[SAMPLES])
  stack = "c_s" if mixed else "c"
  return tfemb.TPUEmbeddingV2(
      features, tfemb.SGD(LR),
      sparse_core_embedding_config=tfemb.SparseCoreEmbeddingConfig(
          max_ids_per_table={stack: LIMIT},
          max_unique_ids_per_table={stack: LIMIT})), stack


def _inputs(mixed, counted_rows=COUNTED_ROWS):
  features = {"custom": tf.ragged.constant(CUSTOM_ROWS, tf.int64)}
  if mixed:
    features["counted"] = tf.ragged.constant(counted_rows, tf.int64)
  return features


def test_the_custom_ids_would_be_over_the_limit_if_counted():
  with pytest.raises(reference.SparseCoreFailure, match="ids"):
    reference.sparse_core_limits(
        [dict(stack="c", position=0, rows=[r[:VALENCY] for r in CUSTOM_ROWS])],
        {"c": SAMPLES}, 1, dict(max_ids={"c": LIMIT}, max_unique_ids={},
                                per_sample=64, dropping=False))


@pytest.mark.parametrize("mixed", [False, True], ids=["only_custom", "mixed"])
@pytest.mark.parametrize("fused", [True, False], ids=["kernels", "ops"])
def test_custom_combiner_features_train_uncounted(fused, mixed):
  with options.use(fused_kernels=fused):
    embedding, stack = _engine(mixed)
  grads = {name: np.random.default_rng(9).uniform(-1, 1, (SAMPLES, DIM))
           for name in ("custom", "counted")}

  @tf.function
  def step(features):
    activations, preserved = embedding(features)
    embedding.apply_gradients(
        {k: tf.constant(grads[k], tf.float32) for k in activations}, preserved)
    return activations

  custom = reference.Table(INIT["c"], "sgd", {})
  counted = reference.Table(INIT["s"], "sgd", {})
  ones = np.ones(VALENCY)
  for _ in range(2):
    activations = step(_inputs(mixed))
    np.testing.assert_allclose(
        activations["custom"].numpy(),
        reference.positional(custom.w, CUSTOM_ROWS, ones, VALENCY), rtol=1e-5)
    pairs, _ = reference.positional_gradients(custom.w, CUSTOM_ROWS, ones,
                                              VALENCY, grads["custom"])
    custom.apply(reference.row_gradients(pairs), LR)
    if mixed:
      np.testing.assert_allclose(
          activations["counted"].numpy(),
          reference.combine(counted.w, COUNTED_ROWS, "sum"), rtol=1e-5)
      counted.apply(reference.row_gradients(reference.contributions(
          COUNTED_ROWS, "sum", grads["counted"])), LR)
  tables = table_stacking.to_unstacked(
      embedding._stacking,  # pylint: disable=protected-access
      {stack: embedding.embedding_tables[stack].numpy()})
  np.testing.assert_allclose(tables["c"], custom.w, rtol=1e-5, atol=1e-6)
  if not mixed:
    return
  np.testing.assert_allclose(tables["s"], counted.w, rtol=1e-5, atol=1e-6)
  # The counted feature is still held to the limit: 3 ids of one sample in
  # one cell fail the batch, and nothing is written.
  with pytest.raises(tf.errors.InvalidArgumentError, match="over the limit"):
    step(_inputs(mixed, [[0, 4, 8]] + COUNTED_ROWS[1:]))
  after = table_stacking.to_unstacked(
      embedding._stacking,  # pylint: disable=protected-access
      {stack: embedding.embedding_tables[stack].numpy()})
  for name in tables:
    np.testing.assert_array_equal(after[name], tables[name])
