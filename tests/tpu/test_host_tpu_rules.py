"""What a TPU refuses, refused on the host TPU as TensorFlow's engines
refuse it on a TPU, with TensorFlow's words (tfemb/tpu/host/tpu_rules.py,
docs/tpu.md): each refusal leaves every table as it was, and the same
program written as a TPU takes it trains with the TPU's numbers
(tests/reference.py). A v4-8 (embedding hardware V1), 4 replicas in this
process (tests/conftest.py)."""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference

API = tf.tpu.experimental.embedding
VOCAB, DIM, PER_REPLICA, REPLICAS = 8, 2, 2, 4
INIT = np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM) / 10


@pytest.fixture(name="tpu")
def fixture_tpu():
  with helpers.host_tpu("v4-8") as setup:
    yield setup


def _engine(strategy, build=True):
  with strategy.scope():
    table = API.TableConfig(VOCAB, DIM, name="t",
                            initializer=tf.constant_initializer(INIT))
    embedding = API.TPUEmbedding({"f": API.FeatureConfig(table)},
                                 API.SGD(0.5))
    if build:
      embedding.build(PER_REPLICA)
  return embedding


def _ids(strategy, fetch_to_device=False):
  ids = np.arange(REPLICAS * PER_REPLICA) % VOCAB
  data = tf.data.Dataset.from_tensor_slices(
      {"f": ids.astype(np.int32)}).batch(REPLICAS * PER_REPLICA,
                                         drop_remainder=True)
  options = (None if fetch_to_device else tf.distribute.InputOptions(
      experimental_fetch_to_device=False))
  return ids, iter(strategy.experimental_distribute_dataset(data, options))


def _table(embedding):
  return embedding.embedding_tables[
      embedding._table_config[0]].numpy()  # pylint: disable=protected-access


def _train_in_replica(strategy, embedding, batches, transform=None,
                      nested=False):
  """One step with the enqueue inside `strategy.run` (the TPU's outside
  compilation): `transform` computes the ids from the replica's
  arguments; `nested` enqueues from a tf.function inside the replica."""
  enqueue = tf.function(embedding.enqueue) if nested else embedding.enqueue

  @tf.function
  def step():
    def replica(features):
      if transform is not None:
        features = {"f": transform(features["f"])}
      enqueue(features, training=True)
      activations = embedding.dequeue()
      embedding.apply_gradients({"f": tf.ones_like(activations["f"])})
    strategy.run(replica, args=(next(batches),))

  step()


def test_an_enqueue_inside_strategy_run_takes_the_replicas_own_inputs(tpu):
  strategy, _ = tpu
  embedding = _engine(strategy)
  ids, batches = _ids(strategy)
  _train_in_replica(strategy, embedding, batches)
  want = reference.Table(INIT, "sgd", {})
  want.apply(reference.row_gradients(zip(ids, np.ones((len(ids), DIM)))),
             0.5)
  np.testing.assert_allclose(_table(embedding), want.w, rtol=1e-6)


@pytest.mark.parametrize("how,error,match", [
    ("nested", RuntimeError,
     "does not match graph which contains TPUReplicateContext"),
    ("computed", ValueError,
     r"output of op .* which does not have the `_tpu_input_identity` attr"),
])
def test_what_a_tpu_refuses_in_an_enqueue_is_refused(tpu, how, error, match):
  strategy, _ = tpu
  embedding = _engine(strategy)
  _, batches = _ids(strategy)
  with pytest.raises(error, match=match):
    _train_in_replica(strategy, embedding, batches,
                      transform=(lambda f: f * 1) if how == "computed"
                      else None, nested=how == "nested")
  np.testing.assert_array_equal(_table(embedding), INIT)


ON_A_TPU_DEVICE = (r"Received input tensor f which is on a TPU input device "
                   r"/job:localhost/replica:0/task:0/device:CPU:\d\. Input "
                   r"tensors for TPU embeddings must be placed on the CPU\.")


@pytest.mark.parametrize("where", ["outside", "inside", "eager"])
def test_a_batch_fetched_to_the_tpus_devices_is_refused(tpu, where):
  """A distributed dataset fetches to the replicas' devices (the TPU's)
  unless told not to: TensorFlow's enqueue refuses such a batch, outside
  `strategy.run` or inside it, and so does the host TPU."""
  strategy, _ = tpu
  embedding = _engine(strategy)
  _, batches = _ids(strategy, fetch_to_device=True)

  def step():
    if where == "inside":
      strategy.run(lambda f: embedding.enqueue(f, training=True),
                   args=(next(batches),))
    else:
      embedding.enqueue(next(batches), training=True)

  with pytest.raises(ValueError, match=ON_A_TPU_DEVICE):
    step() if where == "eager" else tf.function(step)()
  np.testing.assert_array_equal(_table(embedding), INIT)


@pytest.mark.parametrize("how", ["kept on the host", "iterator argument"])
def test_the_same_batch_trains_where_tensorflow_sees_no_tpu_device(tpu,
                                                                     how):
  """Kept on the host (`experimental_fetch_to_device=False`), or read from
  an iterator a `tf.function` takes as its argument (as Keras' `fit` does),
  whose batches name no device in TensorFlow's own iterator either."""
  strategy, _ = tpu
  embedding = _engine(strategy)
  ids, batches = _ids(strategy, fetch_to_device=how == "iterator argument")

  @tf.function
  def step(iterator):
    embedding.enqueue(next(iterator), training=True)
    strategy.run(lambda: embedding.apply_gradients(
        {"f": tf.ones_like(embedding.dequeue()["f"])}))

  step(batches)
  want = reference.Table(INIT, "sgd", {})
  want.apply(reference.row_gradients(zip(ids, np.ones((len(ids), DIM)))),
             0.5)
  np.testing.assert_allclose(_table(embedding), want.w, rtol=1e-6)


def test_one_tpu_embedding_configures_the_tpu_until_it_is_initialized(tpu):
  strategy, resolver = tpu
  _engine(strategy)
  second = _engine(strategy, build=False)
  with pytest.raises(RuntimeError,
                     match="TPU is already initialized for embeddings"):
    second.build(PER_REPLICA)
  assert not second.built
  tf.tpu.experimental.initialize_tpu_system(resolver)
  second.build(PER_REPLICA)
  np.testing.assert_array_equal(_table(second), INIT)


def test_build_needs_every_output_shape_as_on_a_tpu(tpu):
  strategy, _ = tpu
  embedding = _engine(strategy, build=False)
  with pytest.raises(ValueError, match="Input Feature f has output shape"):
    embedding.build()
  assert not embedding.built


def test_outside_the_tpu_strategy_tensorflows_engines_are_tensorflows(tpu):
  """On a TPU's host, outside its TPUStrategy, TensorFlow's V1 engine
  takes its CPU path (its TPU protocol refused) and the V2 and V0 engines
  refuse to be created: so on the host TPU."""
  del tpu
  table = API.TableConfig(VOCAB, DIM, name="t")
  cpu = API.TPUEmbedding({"f": API.FeatureConfig(table)}, API.SGD(0.1))
  assert type(cpu) is API.TPUEmbedding
  with pytest.raises(RuntimeError, match="not created under a TPUStrategy"):
    cpu.enqueue({"f": tf.constant([1])})
  feature = API.FeatureConfig(table, output_shape=[PER_REPLICA])
  for engine in (API.TPUEmbeddingV2, API.TPUEmbeddingV0):
    with pytest.raises(RuntimeError, match="should be created under "
                       "TPUStrategy"):
      engine({"f": feature}, API.SGD(0.1))
