"""A host TPUStrategy's distributed datasets (tfemb/tpu/host/datasets.py): each
replica gets the batch TensorFlow's `MirroredStrategy` gives it over the
same devices (TensorFlow's own distribution is the oracle), eagerly (on
the replica's device), in a `tf.function` and as optionals, with a partial
last batch; and an iterator of each new epoch passed to a `tf.function`
traces nothing. (An iterator made inside a `tf.function` is TensorFlow's
own, which here did not finish in two minutes, under `MirroredStrategy`
too: not tested.)"""

import numpy as np
import pytest
import tensorflow as tf

import tfemb

# No Keras: the same work in both passes.
pytestmark = pytest.mark.runs_under("keras3")

EXAMPLES, GLOBAL_BATCH = 10, 4  # the last batch has 2: replicas 2, 3 none


@pytest.fixture(name="strategies", scope="module")
def fixture_strategies():
  """A host v5p-8 (4 replicas) and TensorFlow's MirroredStrategy on its
  devices."""
  patch = tfemb.patch(tpu="v5p-8")
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
    tf.tpu.experimental.initialize_tpu_system(resolver)
    tpu = tf.distribute.TPUStrategy(resolver)
    mirrored = tf.distribute.MirroredStrategy(
        tpu.extended.worker_devices,
        cross_device_ops=tf.distribute.ReductionToOneDevice())
    yield tpu, mirrored
  finally:
    patch.undo()


def _dataset(kind):
  # Sparse: no partial batch, whose empty replicas TensorFlow's own
  # distribution fails ("Serialized sparse should have at least 1
  # serialized tensor"), as it fails here.
  examples = 8 if kind == "sparse" else EXAMPLES
  rows = [list(range(i % 3 + 1)) for i in range(examples)]
  ids = tf.ragged.constant(rows, tf.int64)
  if kind == "dense":
    ids = tf.constant(np.arange(examples)[:, None])
  elif kind == "sparse":
    ids = ids.to_sparse()
  labels = np.arange(examples, dtype=np.float32)
  return tf.data.Dataset.from_tensor_slices(({"x": ids}, labels)).batch(
      GLOBAL_BATCH)


def _plain(value):
  if isinstance(value, tf.RaggedTensor):
    return value.to_list()
  if isinstance(value, tf.SparseTensor):
    return (value.indices.numpy().tolist(), value.values.numpy().tolist(),
            value.dense_shape.numpy().tolist())
  return value.numpy().tolist()


def _replicas(strategy, batch):
  """Each replica's batch, as Python values, and its device."""
  return [(tf.nest.map_structure(_plain, local),
           tf.nest.flatten(local, expand_composites=True)[0].device)
          for local in strategy.experimental_local_results(batch)]


@pytest.mark.parametrize("kind", ["dense", "ragged", "sparse"])
def test_each_replica_gets_tensorflows_batch(strategies, kind):
  tpu, mirrored = strategies
  host = tpu.experimental_distribute_dataset(_dataset(kind))
  oracle = mirrored.experimental_distribute_dataset(_dataset(kind))
  assert host.element_spec == oracle.element_spec
  want = [_replicas(mirrored, b) for b in oracle]
  assert len(want) == (2 if kind == "sparse" else 3)
  assert [_replicas(tpu, b) for b in host] == want

  @tf.function
  def first_two(iterator):
    return next(iterator), next(iterator)

  values = lambda batches: [[v for v, _ in r] for r in batches]
  for strategy, data in ((tpu, host), (mirrored, oracle)):
    got = first_two(iter(data))  # (placed where the function's ops run)
    assert values([_replicas(strategy, b) for b in got]) == values(want[:2])
  optional = iter(host).get_next_as_optional()
  assert bool(optional.has_value())
  assert values([_replicas(tpu, optional.get_value())]) == values(want[:1])


def test_a_new_epochs_iterator_traces_nothing(strategies):
  tpu, _ = strategies
  data = tpu.experimental_distribute_dataset(_dataset("ragged"))

  @tf.function
  def total(iterator):
    x, y = next(iterator)
    del x
    return tpu.reduce("SUM", tpu.run(tf.reduce_sum, args=(y,)), axis=None)

  sums = [float(total(iter(data))) for _ in range(3)]
  assert sums == [6.0] * 3  # labels 0 + 1 + 2 + 3 of the first batch
  assert total.experimental_get_tracing_count() == 1
