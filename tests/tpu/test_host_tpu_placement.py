"""On a host TPU, each replica's ids are read where the global batch is
looked up, the host's device (`tfemb.host.global_batch.reading`): no op on
a replica's device takes them, so they never cross to it and back. They
are cast there as the type's engine casts them (docs/numerics.md, "Input
dtypes"), once for the global batch: the activations each replica gets
are its own examples' rows of the cast ids (tests/reference.py), and ids
no cast takes are refused naming the feature, with no table changed."""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
from tfemb import tf_internals

VOCAB, DIM, GLOBAL_BATCH, LR = 20, 3, 8, 0.5
INIT = np.random.default_rng(4).normal(size=(VOCAB, DIM))
IDS = np.random.default_rng(5).integers(0, VOCAB, size=GLOBAL_BATCH)
TYPES = ["v4-8",
         pytest.param("v5p-8", marks=pytest.mark.requires_tensorflow("2.17"))]


@pytest.fixture(name="tpu")
def fixture_tpu(request):
  with helpers.host_tpu(request.param) as (strategy, _):
    yield strategy


def _v2(tpu) -> bool:
  return tpu.extended.tpu_hardware_feature.num_embedding_devices_per_chip > 0


def _embedding(tpu):
  """TensorFlow's engine of the type's generation, one table "t" of
  INIT, SGD; its step `(ids) -> each replica's activations`, a
  `tf.function` training on `sum(activations)`."""
  per_replica = GLOBAL_BATCH // tpu.num_replicas_in_sync
  api = tf.tpu.experimental.embedding
  with tpu.scope():
    table = api.TableConfig(VOCAB, DIM, name="t",
                            initializer=tf.constant_initializer(INIT))
    if _v2(tpu):
      embedding = api.TPUEmbeddingV2(
          {"x": api.FeatureConfig(table, output_shape=[per_replica])},
          api.SGD(LR))
      embedding.build()
    else:
      embedding = api.TPUEmbedding({"x": api.FeatureConfig(table)},
                                   api.SGD(LR))
      embedding.build(per_replica_input_shapes={
          "x": tf.TensorShape([per_replica])})

  def replica_step(x):
    if _v2(tpu):
      activations, preserved = embedding({"x": x})
      embedding.apply_gradients({"x": tf.ones([per_replica, DIM])},
                                preserved)
    else:
      embedding.enqueue({"x": x}, training=True)
      activations = embedding.dequeue()
      embedding.apply_gradients({"x": tf.ones([per_replica, DIM])})
    return activations["x"]

  return embedding, tf.function(lambda x: tpu.run(replica_step, args=(x,)))


def _per_replica(tpu, ids, dtype):
  parts = np.asarray(ids, object).reshape(tpu.num_replicas_in_sync, -1)
  return tpu.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(parts[ctx.replica_id_in_sync_group].tolist(),
                              dtype))


def _table(embedding, tpu):
  table = embedding.embedding_tables["t"]
  if not _v2(tpu):
    return table.numpy()
  shards = (tpu.num_replicas_in_sync *
            tpu.extended.tpu_hardware_feature.num_embedding_devices_per_chip)
  stacked = np.concatenate([s.numpy() for s in table.values])
  rows = reference.stacked_rows(VOCAB, shards, 0, stacked.shape[0] // shards,
                                0)
  return stacked[rows, :DIM]


def _check_step(tpu, embedding, got, cast):
  """Each replica's activations are its examples' rows of INIT at the
  `cast` ids; the table took one SGD step on the global batch."""
  per_replica = GLOBAL_BATCH // tpu.num_replicas_in_sync
  for r, rows in enumerate(tpu.experimental_local_results(got)):
    np.testing.assert_allclose(
        rows.numpy(), INIT[cast[r * per_replica:(r + 1) * per_replica]],
        rtol=1e-6)
  want = reference.Table(INIT, "sgd", {})
  want.apply(reference.row_gradients(
      [(i, np.ones(DIM)) for i in cast]), LR)
  np.testing.assert_allclose(_table(embedding, tpu), want.w, rtol=1e-6,
                             atol=1e-6)


@pytest.mark.parametrize("tpu", TYPES, indirect=True)
def test_a_replicas_ids_are_read_on_the_host(tpu):
  embedding, step = _embedding(tpu)
  ids = _per_replica(tpu, IDS, tf.int64)
  _check_step(tpu, embedding, step(ids), IDS)

  graph = step.get_concrete_function(ids).graph
  placeholders = [t for t in graph.inputs if t.dtype == tf.int64]
  assert len(placeholders) == tpu.num_replicas_in_sync
  host = tf.DeviceSpec.from_string(tf_internals.HOST_CPU)
  devices = [tf.DeviceSpec.from_string(op.device)
             for t in placeholders for op in t.consumers()]
  assert devices and all(d == host for d in devices), devices


@pytest.mark.parametrize("tpu", TYPES, indirect=True)
def test_the_replicas_ids_are_cast_as_the_types_engine_casts_them(tpu):
  """Float ids truncate; an int64 id keeps its low 32 bits on a SparseCore
  (2^32 + 3 is 3)."""
  embedding, step = _embedding(tpu)
  if _v2(tpu):
    ids, dtype = [int(i) + 2**32 for i in IDS], tf.int64
    cast = [reference.cast_ids([i], 32)[0] for i in ids]
  else:
    ids, dtype = [float(i) + 0.75 for i in IDS], tf.float32
    cast = [reference.cast_ids([i], 64)[0] for i in ids]
  np.testing.assert_array_equal(cast, IDS)
  _check_step(tpu, embedding, step(_per_replica(tpu, ids, dtype)), cast)


@pytest.mark.parametrize("tpu", TYPES, indirect=True)
def test_ids_no_cast_takes_are_refused_naming_the_feature(tpu):
  embedding, step = _embedding(tpu)
  before = _table(embedding, tpu)
  to = "int32" if _v2(tpu) else "int64"
  with pytest.raises(tf.errors.UnimplementedError,
                     match=rf"Feature `x` \(table `t`\): Cast string to "
                     rf"{to} is not supported"):
    step(_per_replica(tpu, [str(i) for i in IDS], tf.string))
  np.testing.assert_array_equal(_table(embedding, tpu), before)
