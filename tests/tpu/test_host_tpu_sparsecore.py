"""What TensorFlow's SparseCore tests read of a TPU, on the host TPU
(docs/tpu.md, "TensorFlow's own tests"): the strategy's `_tpu_devices`, an
engine's `_num_sc_per_chip`, a stacked table's `read_from_device`,
`enqueue(device=...)`, `_copy_tensors_to_device` before `apply_gradients`,
and TensorFlow's `compute_sparse_core_stats` routed to tfemb's while a TPU
type is emulated. Numbers against tests/reference.py: the stacked layout of
docs/sparsecore.md and the SGD rule. A v5p-8: 4 replicas (chips), 4
SparseCores each (tests/conftest.py gives the 4 devices)."""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
# pylint: disable=g-direct-tensorflow-import
from tensorflow.python.tpu import tpu_embedding_v3
from tensorflow.python.tpu import tpu_replication
# pylint: enable=g-direct-tensorflow-import

pytestmark = pytest.mark.requires_tensorflow("2.17")

API = tf.tpu.experimental.embedding
CHIPS, CORES = 4, 4
VOCAB, DIM, PER_REPLICA = 64, 8, 4
INIT = np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM) / 100


@pytest.fixture(name="tpu")
def fixture_tpu():
  with helpers.host_tpu("v5p-8") as (strategy, _):
    yield strategy


@pytest.fixture(name="one_chip")
def fixture_one_chip():
  """One replica of the v5p-8 (a device assignment), as TensorFlow's
  SparseCore tests take one chip."""
  with helpers.host_tpu("v5p-8") as (_, resolver):
    topology = tf.tpu.experimental.initialize_tpu_system(resolver)
    yield tf.distribute.TPUStrategy(
        resolver, experimental_device_assignment=(
            tf.tpu.experimental.DeviceAssignment.build(topology,
                                                       num_replicas=1)))


def _feature():
  table = API.TableConfig(VOCAB, DIM, name="video", combiner="sum",
                          initializer=tf.constant_initializer(INIT))
  return {"watched": API.FeatureConfig(table, name="watched",
                                        output_shape=[PER_REPLICA])}


def _engine(strategy, learning_rate=1.0):
  with strategy.scope():
    embedding = API.TPUEmbeddingV2(_feature(), API.SGD(learning_rate))
    embedding.build()
  return embedding


def _batches(strategy, ids):
  data = tf.data.Dataset.from_tensor_slices(
      {"watched": ids.astype(np.int32)}).batch(len(ids))
  return iter(strategy.experimental_distribute_dataset(
      data, tf.distribute.InputOptions(experimental_fetch_to_device=False)))


def _expected_chips(table):
  """Each chip's rows of the stacked variable (docs/sparsecore.md): id i at
  `reference.stacked_rows`, rows per SparseCore padded to a multiple of 8
  ids across all SparseCores, padding rows zero."""
  shards = CHIPS * CORES
  rows_per_shard = -(-VOCAB // (8 * shards)) * 8
  stacked = np.zeros((shards * rows_per_shard, DIM), np.float32)
  stacked[reference.stacked_rows(VOCAB, shards, 0, rows_per_shard, 0)] = table
  return np.split(stacked, CHIPS)


def test_a_tpus_devices_and_sparse_cores_as_tensorflows_tests_read_them(tpu):
  embedding = _engine(tpu)
  devices = tpu.extended._tpu_devices  # pylint: disable=protected-access
  assert devices.shape == (CHIPS, 1)
  assert list(devices[:, 0]) == list(tpu.extended.worker_devices)
  assert embedding._num_sc_per_chip == CORES  # pylint: disable=protected-access


def test_each_chip_reads_its_own_rows_of_the_stacked_table(tpu):
  embedding = _engine(tpu)
  stacked = embedding._variables["video"]["parameters"]  # pylint: disable=protected-access
  for device, want in zip(tpu.extended._tpu_devices[:, 0],  # pylint: disable=protected-access
                          _expected_chips(INIT)):
    np.testing.assert_array_equal(stacked.read_from_device(device), want)
  with pytest.raises(ValueError, match=r"video.*no chip of its TPU is on "
                     r".*GPU:0.*its chips' devices are \[.*CPU:0"):
    stacked.read_from_device("/job:localhost/replica:0/task:0/device:GPU:0")


def test_an_enqueue_on_a_replicas_device_then_copy_to_device_and_apply(tpu):
  """TensorFlow's step from `enqueue` to the update without a lookup: a
  sum combiner's gradient g reaches each id of a sample as g (SGD, rate 1,
  every replica's contributions summed)."""
  embedding = _engine(tpu)
  ids = np.array([3, 3, 7, 60, 0, 9, 9, 63, 5, 12, 40, 3, 1, 2, 3, 4])
  batches = _batches(tpu, ids)
  rng = np.random.default_rng(3)
  grads = rng.uniform(-1, 1, (len(ids), DIM)).astype(np.float32)

  @tf.function
  def step(data):
    def replica(features):
      context = tf.distribute.get_replica_context()
      start = context.replica_id_in_sync_group * PER_REPLICA
      partitioned = embedding.enqueue(features)
      copied = tpu_replication.outside_compilation(
          embedding._copy_tensors_to_device,  # pylint: disable=protected-access
          partitioned_tensors=partitioned)
      embedding.apply_gradients(
          {"watched": tf.gather(grads, tf.range(start, start + PER_REPLICA))},
          copied)
    tpu.run(replica, args=(data,))

  step(next(batches))
  want = reference.Table(INIT, "sgd", {})
  want.apply(reference.row_gradients(reference.contributions(
      [[i] for i in ids], "sum", grads)), 1.0)
  stacked = embedding._variables["video"]["parameters"]  # pylint: disable=protected-access
  for device, rows in zip(tpu.extended.worker_devices,
                          _expected_chips(want.w)):
    np.testing.assert_allclose(stacked.read_from_device(device), rows,
                               rtol=1e-6, atol=1e-6)


def test_enqueue_takes_a_replicas_device_and_refuses_one_outside_the_tpu(tpu):
  embedding = _engine(tpu)
  before = embedding._variables["video"]["parameters"].read_value().numpy()  # pylint: disable=protected-access
  features = {"watched": tf.constant([1, 2, 3, 4], tf.int32)}
  embedding.enqueue(features, device=tpu.extended.worker_devices[0])
  with pytest.raises(ValueError,
                     match=r"^Non-TPU device /job:localhost/replica:0/task:0"
                     r"/device:GPU:0 passed to enqueue\.$"):
    embedding.enqueue(features,
                      device="/job:localhost/replica:0/task:0/device:GPU:0")
  np.testing.assert_array_equal(
      embedding._variables["video"]["parameters"].read_value(), before)  # pylint: disable=protected-access


def test_an_enqueue_passed_through_strategy_run_is_its_batch(one_chip):
  """TensorFlow's SparseCore tests enqueue a chip's batch outside
  `strategy.run` and pass it in: the replica's copy holds the same tensors,
  so it is the same batch (dequeued, updated once)."""
  embedding = _engine(one_chip)
  ids = np.array([3, 3, 7, 60])
  grads = np.arange(len(ids) * DIM, dtype=np.float32).reshape(-1, DIM) / 8

  @tf.function
  def step(features):
    def replica(partitioned):
      activations, preserved = embedding.dequeue(partitioned)
      embedding.apply_gradients({"watched": tf.constant(grads)}, preserved)
      return activations["watched"], preserved
    partitioned = embedding.enqueue(
        features, device=one_chip.extended.worker_devices[0])
    return one_chip.run(replica, args=(partitioned,))

  activations, _ = step({"watched": tf.constant(ids, tf.int32)})
  np.testing.assert_allclose(activations, INIT[ids])
  want = reference.Table(INIT, "sgd", {})
  want.apply(reference.row_gradients(reference.contributions(
      [[i] for i in ids], "sum", grads)), 1.0)
  got = embedding._variables["video"]["parameters"].read_from_device(  # pylint: disable=protected-access
      one_chip.extended.worker_devices[0])
  np.testing.assert_allclose(
      got, _one_chip(want.w, one_chip), rtol=1e-6, atol=1e-6)


def _one_chip(table, strategy):
  """The one chip's stacked rows (docs/sparsecore.md)."""
  del strategy  # one chip of 4 SparseCores
  rows_per_shard = -(-VOCAB // (8 * CORES)) * 8
  stacked = np.zeros((CORES * rows_per_shard, DIM), np.float32)
  stacked[reference.stacked_rows(VOCAB, CORES, 0, rows_per_shard, 0)] = table
  return stacked


def test_a_copy_of_a_lookups_tables_is_refused_by_apply_gradients(tpu):
  """`strategy.run` and a function's outputs rebuild a dict: the copy has
  the tables but not the batch its update needs."""
  embedding = _engine(tpu)
  before = embedding._variables["video"]["parameters"].read_value().numpy()  # pylint: disable=protected-access

  @tf.function
  def lookup(features):
    return embedding(features)

  activations, preserved = lookup({"watched": tf.constant([1, 2, 3, 4])})
  with pytest.raises(ValueError, match=r"are a copy of a lookup's tables "
                     r"holding other tensors.*expected the output of this "
                     r"object's enqueue"):
    embedding.apply_gradients(
        {"watched": tf.ones_like(activations["watched"])}, preserved)
  np.testing.assert_array_equal(
      embedding._variables["video"]["parameters"].read_value(), before)  # pylint: disable=protected-access


def _numpy_stats(features, tables, chips):
  """docs/sparsecore.md, "Id limits": sample k of S on SparseCore
  k // (S / 4), id i of a stack's t-th table in partition (i + 4t) mod N;
  the most (feature, sample, id) entries, and distinct (table, id), of one
  (SparseCore, partition)."""
  n = chips * CORES
  ids, unique = {}, {}
  for name, rows in features.items():
    t = tables[name]
    for k, row in enumerate(rows):
      for i in set(row):
        cell = (k // (len(rows) // CORES), (i + t * CORES) % n)
        ids[cell] = ids.get(cell, 0) + 1
        unique.setdefault(cell, set()).add((t, i))
  return max(ids.values()), max(len(s) for s in unique.values())


def test_tensorflows_sparse_core_stats_run_tfembs_while_a_tpu_is_emulated(
    tpu):
  """TensorFlow's classmethod calls an op a TPU's host has: routed to
  tfemb's count on the CPU while the patch is on, TensorFlow's own after."""
  del tpu
  a = API.TableConfig(64, 8, name="a")
  b = API.TableConfig(40, 8, name="b")
  config = {"x": API.FeatureConfig(a, output_shape=[16]),
            "y": API.FeatureConfig(a, output_shape=[16]),
            "z": API.FeatureConfig(b, output_shape=[16])}
  rng = np.random.default_rng(0)
  rows = {k: [list(rng.integers(0, 40, rng.integers(1, 6)))
              for _ in range(16)] for k in "xyz"}
  features = {k: tf.ragged.constant(v, dtype=tf.int64)
              for k, v in rows.items()}
  max_ids, max_unique = tpu_embedding_v3.TPUEmbeddingV2.compute_sparse_core_stats(
      features, config, num_tpu_chips=2)
  want = _numpy_stats(rows, {"x": 0, "y": 0, "z": 1}, chips=2)
  assert (int(max_ids["a_b"]), int(max_unique["a_b"])) == want


def test_the_stats_route_ends_with_the_patch():
  """Outside an emulated TPU, TensorFlow's own code runs: its op has no
  CPU kernel."""
  a = API.TableConfig(64, 8, name="a")
  args = ({"x": tf.constant(list(range(16)), tf.int64)},
          {"x": API.FeatureConfig(a, output_shape=[16])}, 1)
  with tfemb.patch(tpu="v5p-8"):
    max_ids, _ = tpu_embedding_v3.TPUEmbeddingV2.compute_sparse_core_stats(
        *args)
    assert int(max_ids["a"]) == 1  # ids 0..15: one per partition and core
  for patch in (tfemb.patch(), None):  # the CPU patch routes no TPU op
    with pytest.raises(tf.errors.NotFoundError,
                       match="ConvertToListOfSparseCoreCooTensors"):
      tpu_embedding_v3.TPUEmbeddingV2.compute_sparse_core_stats(*args)
    if patch is not None:
      patch.undo()
