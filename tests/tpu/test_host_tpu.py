"""A TPU program's own calls on the CPU: `tfemb.patch(tpu=TYPE)`.

The resolver, `initialize_tpu_system` and `TPUStrategy(resolver)` give a
host `TPUStrategy` with the type's replicas and embedding hardware; the
strategy's API works as on a TPU; tfemb's classes train with the TPU's
numbers (tests/reference.py) on the host engine of the type's generation.
This process has 4 logical CPUs (tests/conftest.py): the types with 4
replicas run here, the 8-replica ones in tests/tpu/test_host_tpu_programs.py.
"""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
# pylint: disable=g-direct-tensorflow-import
from tensorflow.python.data.ops import multi_device_iterator_ops
from tensorflow.python.distribute import tpu_strategy
from tensorflow.python.distribute.cluster_resolver.tpu import tpu_cluster_resolver as tf_resolver_lib
from tensorflow.python.eager import remote
from tensorflow.python.tpu import tpu_strategy_util
# pylint: enable=g-direct-tensorflow-import
from tfemb import tf_versions
from tfemb.tpu.host import system as host_system
from tfemb.tpu.host import tpu_types

EmbeddingFeature = tf.tpu.experimental.HardwareFeature.EmbeddingFeature
TPU_STRATEGY = tf.distribute.TPUStrategy  # TensorFlow's, before any patch
# The SparseCore host engine needs TensorFlow 2.17's stacker.
SPARSECORE = pytest.mark.requires_tensorflow("2.17")

# The table of types (Cloud TPU's documentation): replicas,
# embedding hardware, SparseCores per chip.
DOCUMENTED = {
    "v2-8": (8, EmbeddingFeature.V1, 0), "v3-8": (8, EmbeddingFeature.V1, 0),
    "v4-8": (4, EmbeddingFeature.V1, 0),
    "v5litepod-8": (8, EmbeddingFeature.UNSUPPORTED, 0),
    "v5p-8": (4, EmbeddingFeature.V2, 4), "v6e-8": (8, EmbeddingFeature.V2, 2),
}


@pytest.fixture(name="tpu")
def fixture_tpu(request):
  """The strategy a TPU program makes under `tfemb.patch(tpu=...)` for the
  test's type."""
  with helpers.host_tpu(request.param) as (strategy, _):
    yield strategy


def test_the_documented_types():
  for name, (replicas, feature, cores) in DOCUMENTED.items():
    tpu_type = tpu_types.lookup(name)
    assert (tpu_type.num_replicas, tpu_type.embedding_feature,
            tpu_type.sparse_cores_per_chip, tpu_type.num_hosts) == (
                replicas, feature, cores, 1), name
  assert tpu_types.lookup("v5e-8") == tpu_types.lookup("v5litepod-8")


@pytest.mark.parametrize("tpu", ["v5p-8", "v4-8", "v5litepod-4"],
                         indirect=True)
def test_a_tpu_programs_setup_gives_a_host_tpu_strategy(tpu):
  tpu_type = tpu.extended.tpu_type
  assert isinstance(tpu, TPU_STRATEGY)
  assert isinstance(tpu, tf.distribute.experimental.TPUStrategy)
  assert tpu.num_replicas_in_sync == tpu_type.num_replicas == 4
  feature = tpu.extended.tpu_hardware_feature
  assert feature.embedding_feature == tpu_type.embedding_feature
  assert feature.num_embedding_devices_per_chip == (
      tpu_type.sparse_cores_per_chip)
  assert tpu.extended.num_hosts == 1
  assert tpu.extended.worker_devices == tuple(
      f"/job:localhost/replica:0/task:0/device:CPU:{k}" for k in range(4))
  for name in ("", "local", "my-tpu"):
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=name)
    topology = tf.tpu.experimental.initialize_tpu_system(resolver)
    assert list(topology.mesh_shape) == list(tpu_type.mesh_shape)
    assert topology.num_tasks == 1 and topology.num_tpus_per_task == 4
    assert resolver.get_tpu_system_metadata().num_cores == 4
    assert resolver.num_accelerators() == {"TPU": 4}
    assert resolver.tpu_hardware_feature.embedding_feature == (
        feature.tpu_hardware_feature_proto.embedding_feature)
    old_style = tf.distribute.experimental.TPUStrategy(resolver)
    assert old_style.num_replicas_in_sync == 4
    tf.tpu.experimental.shutdown_tpu_system(resolver)
  if not tf_versions.at_least("2.18"):
    # TensorFlow 2.16 and 2.17's own `connect()` calls its
    # `initialize_tpu_system_impl` without the resolver class it needs, and
    # fails so on a TPU: the host TPU's hook keeps that function's
    # signature, so it fails the same.
    with pytest.raises(TypeError, match="tpu_cluster_resolver_cls"):
      tf.distribute.cluster_resolver.TPUClusterResolver.connect()
  else:
    connected = tf.distribute.cluster_resolver.TPUClusterResolver.connect()
    assert tf.distribute.TPUStrategy(connected).cluster_resolver is connected
  # A device assignment of one replica, as keras-rs' tests make.
  one = tf.tpu.experimental.DeviceAssignment.build(
      topology, num_replicas=1)
  assert tf.distribute.TPUStrategy(
      resolver, experimental_device_assignment=one).num_replicas_in_sync == 1


# A TPU program's set-up by TensorFlow's internal paths, as TensorFlow's own
# TPU tests write it, kept before any patch.
INTERNAL = (tf_resolver_lib.TPUClusterResolver, remote.connect_to_cluster,
            tpu_strategy_util.initialize_tpu_system_impl,
            tf_resolver_lib.initialize_tpu_system, tpu_strategy.TPUStrategy,
            tpu_strategy.TPUStrategyV2)
PUBLIC = (tf.distribute.TPUStrategy, tf.tpu.experimental.initialize_tpu_system,
          tf.config.list_logical_devices, tf.device,
          tf.distribute.cluster_resolver.TPUClusterResolver,
          tf.config.experimental_connect_to_cluster)
CODE = [f.__code__ for f in PUBLIC + INTERNAL if hasattr(f, "__code__")]


def test_every_path_reaches_the_host_and_no_name_changes():
  resolver_class, connect, impl, initialize, v1_class, v2_class = INTERNAL
  with tfemb.patch(tpu="v5p-8") as patch:
    assert patch.tpu == "v5p-8"
    assert (tf.distribute.TPUStrategy, tf.tpu.experimental.initialize_tpu_system,
            tf.config.list_logical_devices, tf.device,
            tf.distribute.cluster_resolver.TPUClusterResolver,
            tf.config.experimental_connect_to_cluster) == PUBLIC
    resolver = resolver_class(tpu="", zone=None, project=None)
    assert isinstance(resolver, host_system.HostTPUClusterResolver)
    # What TensorFlow's own base test calls on a Cloud TPU's resolver.
    resolver._cloud_tpu_client.configure_tpu_version(  # pylint: disable=protected-access
        version="nightly", restart_type="always")
    assert connect(resolver) is None
    topology = initialize(resolver)
    assert list(topology.mesh_shape) == [2, 2, 1, 1]
    assert impl(resolver, resolver_class).num_tasks == 1
    for cls in (v1_class, v2_class):
      strategy = cls(resolver)
      assert type(strategy).__name__ == "HostTPUStrategy"
      assert strategy.num_replicas_in_sync == 4
    # Anything else still goes to TensorFlow's own code.
    with pytest.raises(ValueError, match="must be a `ClusterSpec` or a"):
      connect("not a cluster")
  assert (tf.distribute.TPUStrategy, tf.tpu.experimental.initialize_tpu_system,
          tf.config.list_logical_devices, tf.device,
          tf.distribute.cluster_resolver.TPUClusterResolver,
          tf.config.experimental_connect_to_cluster) == PUBLIC
  assert [f.__code__ for f in PUBLIC + INTERNAL
          if hasattr(f, "__code__")] == CODE
  assert host_system.active_type() is None
  with pytest.raises(ValueError, match="TPU"):  # TensorFlow's own again
    resolver_class(tpu="")


@pytest.mark.parametrize("tpu", ["v5p-8"], indirect=True)
def test_the_strategy_api_as_on_a_tpu(tpu, tmp_path):
  data = tf.data.Dataset.range(16).map(lambda x: tf.cast(x, tf.float32))
  dist = tpu.experimental_distribute_dataset(data.batch(8))

  @tf.function
  def step(x):
    def replica(x):
      context = tf.distribute.get_replica_context()
      return x * 2.0, context.all_reduce("sum", tf.reduce_sum(x))
    return tpu.run(replica, args=(x,))

  batches = list(dist)
  doubled, total = step(batches[0])
  np.testing.assert_array_equal(tpu.gather(doubled, axis=0),
                                np.arange(8) * 2.0)
  assert [float(t) for t in tpu.experimental_local_results(total)] == [28.0] * 4
  assert float(tpu.reduce("SUM", doubled, axis=0)) == 56.0

  def dataset_fn(context):
    assert context.num_replicas_in_sync == 4
    return data.shard(context.num_input_pipelines,
                      context.input_pipeline_id).batch(2)

  from_function = next(iter(tpu.distribute_datasets_from_function(dataset_fn)))
  assert len(tpu.experimental_local_results(from_function)) == 4
  with pytest.raises(NotImplementedError, match="pure eager"):
    tpu.run(lambda: tf.constant(1.0))  # as TensorFlow's TPUStrategy refuses

  with tpu.scope():
    variable = tf.Variable([1.0, 2.0])
  checkpoint = tf.train.Checkpoint(v=variable)
  path = checkpoint.save(str(tmp_path / "ckpt"))
  variable.assign([5.0, 6.0])
  checkpoint.restore(path)
  np.testing.assert_array_equal(variable.numpy(), [1.0, 2.0])


@pytest.mark.parametrize("tpu,engine", [
    ("v4-8", "TPUEmbedding"),
    pytest.param("v5p-8", "TPUEmbeddingV2", marks=SPARSECORE),
    ("v5litepod-4", "TPUEmbeddingV0")], indirect=["tpu"])
def test_each_generation_gets_tfembs_host_engine(tpu, engine):
  table = tfemb.TableConfig(16, 4, name="t")
  features = {"f": tfemb.FeatureConfig(table, output_shape=[8])}
  with tpu.scope():
    layer = tfemb.layers.TPUEmbedding(features, tfemb.Adagrad(0.1))
    patched = tf.tpu.experimental.embedding
    made = getattr(patched, engine)(features, tfemb.Adagrad(0.1))
  assert type(layer._tpu_embedding) is getattr(tfemb, engine)
  assert type(made) is getattr(tfemb, engine)


def _global_batch(rng, steps, batch, vocab):
  return [helpers.random_rows(rng, batch, vocab, 3, min_len=1)
          for _ in range(steps)]


@pytest.mark.parametrize("tpu,case", [
    ("v4-8", "adagrad"), ("v4-8", "ftrl"),
    pytest.param("v5p-8", "adam", marks=SPARSECORE),
    pytest.param("v6e-4", "sgd", marks=SPARSECORE)], indirect=["tpu"])
def test_replicas_train_as_one_on_the_global_batch(tpu, case):
  """A TPU training loop (the type's engine protocol, `strategy.run`) over
  4 replicas gives the reference's tables for the global batch."""
  rng = np.random.default_rng(7)
  vocab, dim, batch, steps = 24, 4, 16, 3
  init = rng.uniform(-0.5, 0.5, (vocab, dim))
  rows = _global_batch(rng, steps, batch, vocab)
  coef = rng.uniform(-1, 1, (steps, batch, dim)).astype(np.float32)
  v2 = tpu.extended.tpu_type.embedding_feature == EmbeddingFeature.V2
  per_replica = batch // 4
  with tpu.scope():
    table = tfemb.TableConfig(vocab, dim, name="t", combiner="sum",
                              initializer=tf.constant_initializer(init))
    feature = tfemb.FeatureConfig(
        table, output_shape=[per_replica] if v2 else None)
    engine_class = (tf.tpu.experimental.embedding.TPUEmbeddingV2 if v2 else
                    tf.tpu.experimental.embedding.TPUEmbedding)
    embedding = engine_class({"f": feature}, helpers.optimizer(
        case, tf.tpu.experimental.embedding))
    if not v2:
      embedding.build(per_replica_input_shapes={
          "f": tf.TensorShape([per_replica, None])})

  def replica_step(ids, c):
    with tf.GradientTape() as tape:
      if v2:
        activations, preserved = embedding({"f": ids})
      else:
        activations = embedding.dequeue()
      tape.watch(activations)
      loss = tf.reduce_sum(activations["f"] * c)
    gradients = tape.gradient(loss, activations)
    if v2:
      embedding.apply_gradients(gradients, preserved)
    else:
      embedding.apply_gradients(gradients)

  @tf.function
  def step(iterator):
    ids, c = next(iterator)
    if not v2:
      embedding.enqueue({"f": ids}, training=True)
    tpu.run(replica_step, args=(ids, c))

  data = tf.data.Dataset.from_tensor_slices(
      (tf.ragged.constant(sum(rows, []), dtype=tf.int64),
       coef.reshape(-1, dim))).batch(batch)
  iterator = iter(tpu.experimental_distribute_dataset(
      data, tf.distribute.InputOptions(experimental_fetch_to_device=False)))
  for _ in range(steps):
    step(iterator)

  kind, params = helpers.reference_optimizer(case)
  expected = reference.Table(init, kind, params)
  for step_rows, step_coef in zip(rows, coef):
    expected.apply(reference.row_gradients(reference.contributions(
        step_rows, "sum", step_coef)), params["learning_rate"])
  if v2:
    (stacked,) = embedding.embedding_tables.values()
    got = np.concatenate([s.numpy() for s in stacked.values])
    assert len(stacked.values) == 4  # one shard per chip, as on a TPU
    got = _unstacked(got, vocab, dim, tpu)
  else:
    variable = embedding.embedding_tables[table]
    # One copy for every replica, as a TPU's embedding memory.
    assert len(tpu.experimental_local_results(variable)) == 1
    got = variable.numpy()
  np.testing.assert_allclose(got, expected.w, rtol=2e-5, atol=2e-6)


def _unstacked(stacked, vocab, dim, tpu):
  """A one-table stack's rows back in id order (docs/sparsecore.md)."""
  feature = tpu.extended.tpu_hardware_feature
  n = 4 * feature.num_embedding_devices_per_chip
  rows_per_shard = stacked.shape[0] // n
  order = reference.stacked_rows(vocab, n, 0, rows_per_shard, 0)
  return stacked[order, :dim]


@pytest.mark.parametrize("tpu", ["v4-8"], indirect=True)
def test_a_checkpoint_restores_before_and_after_the_tables_exist(tpu,
                                                                   tmp_path):
  """What TensorFlow's checkpoint tests check of a TPU's tables: a restore
  gives the checkpoint's values, whether the tables exist yet or not
  (TensorFlow's deferred restore), for the parameters and the slots."""
  api = tf.tpu.experimental.embedding
  rows = tpu.num_replicas_in_sync * 2

  def engine(init):
    with tpu.scope():
      table = api.TableConfig(rows, 4, name="table", combiner="sum",
                              initializer=tf.constant_initializer(init))
      return api.TPUEmbedding((api.FeatureConfig(table, name="f"),),
                              api.Adagrad(0.1))

  def values(embedding):
    variables = embedding.variables[embedding._table_config[0]]  # pylint: disable=protected-access
    return {k: v.numpy() for k, v in variables.items()}

  saved = engine(np.full((rows, 4), 1.0, np.float32))
  saved.build(8)
  for name, variable in saved.variables[saved._table_config[0]].items():  # pylint: disable=protected-access
    variable.assign(np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) +
                    (0.5 if name != "parameters" else 0.0))
  want = values(saved)
  path = tf.train.Checkpoint(model=saved).save(str(tmp_path / "ckpt"))

  tf.tpu.experimental.initialize_tpu_system()  # the TPU's engine again
  after = engine(np.zeros((rows, 4), np.float32))
  after.build(8)
  tf.train.Checkpoint(model=after).restore(path)
  tf.tpu.experimental.initialize_tpu_system()
  before = engine(np.zeros((rows, 4), np.float32))
  tf.train.Checkpoint(model=before).restore(path)
  before.build(8)
  for restored in (after, before):
    got = values(restored)
    assert sorted(got) == sorted(want) == ["accumulators", "parameters"]
    for name in want:
      np.testing.assert_array_equal(got[name], want[name])


def test_an_unknown_type_lists_the_known_ones():
  with pytest.raises(ValueError, match=r"Unknown TPU type 'v9-8'.*v5p-8"):
    tfemb.patch(tpu="v9-8")
  assert tf.distribute.TPUStrategy is TPU_STRATEGY


def test_a_patch_after_tensorflow_set_up_fewer_devices_says_what_to_do():
  """This process has set up 4 logical CPUs: a type of 8 replicas cannot
  have them, and nothing is routed."""
  tf.constant(0)  # TensorFlow's devices are set up
  with pytest.raises(RuntimeError, match=r"v6e-8 has 8 replicas.*already "
                     r"set up.*4 logical CPU devices.*before the program "
                     r"creates any tensor.*tfemb.run --tpu v6e-8"):
    tfemb.patch(tpu="v6e-8")
  assert tf.distribute.TPUStrategy is TPU_STRATEGY
  assert host_system.active_type() is None


def test_one_process_emulates_one_type():
  with tfemb.patch(tpu="v5p-8"):
    with pytest.raises(ValueError, match="v4-8.*emulating a v5p-8"):
      tfemb.patch(tpu="v4-8")
    with tfemb.patch() as inner:  # a nested patch keeps the type
      assert inner.tpu == "v5p-8"


@pytest.mark.parametrize("tpu", ["v5p-8"], indirect=True)
def test_tpu_device_names_are_refused(tpu):
  del tpu
  for call in (lambda: tf.config.list_logical_devices("TPU"),
               lambda: tf.config.list_physical_devices("TPU"),
               lambda: tf.device("/job:worker/replica:0/task:0/device:TPU:0")):
    with pytest.raises(RuntimeError, match="no TPU devices.*logical CPU"):
      call()
  assert len(tf.config.list_logical_devices("CPU")) == 4
  with tf.device("/CPU:1"):
    assert tf.constant(1.0).device.endswith("CPU:1")


@pytest.mark.parametrize("tpu", ["v5p-8"], indirect=True)
def test_the_host_tpus_datasets_run_without_autotuning(tpu):
  """Freeing a per-replica iterator with tf.data's autotuning on waits for
  each replica's autotuning thread, up to a minute each, holding the GIL
  (tfemb/tpu/host/strategy.py): the host TPU's datasets run without it,
  the program's other options kept, the batches as they were."""
  options = tf.data.Options()
  options.deterministic = False
  data = tf.data.Dataset.range(16).batch(8).with_options(options)
  distributed = [
      tpu.experimental_distribute_dataset(data),
      tpu.distribute_datasets_from_function(
          lambda context: data.unbatch().batch(2).with_options(options))]
  # TensorFlow's attributes: each replica's (or worker's) dataset.
  datasets = (distributed[0]._cloned_datasets +  # pylint: disable=protected-access
              distributed[1]._datasets)  # pylint: disable=protected-access
  for dataset in datasets:
    assert dataset.options().autotune.enabled is False
    assert dataset.options().deterministic is False
  for each in distributed:
    batch = next(iter(each))
    np.testing.assert_array_equal(
        np.concatenate([v.numpy() for v in
                        tpu.experimental_local_results(batch)]),
        np.arange(8))
  # And each replica device's dataset of any multi-device iterator (its
  # TensorFlow attributes: what it builds its devices' datasets from).
  devices = tpu.extended.worker_devices
  iterator = multi_device_iterator_ops.MultiDeviceIterator(data, devices)
  per_device = multi_device_iterator_ops._create_device_dataset(  # pylint: disable=protected-access
      iterator._prototype_device_datasets[0], iterator._incarnation_id, 1,  # pylint: disable=protected-access
      False)
  assert per_device.options().autotune.enabled is False


@pytest.mark.parametrize("tpu", ["v5p-8"], indirect=True)
def test_a_device_assignment_of_several_cores_per_replica_is_refused(tpu):
  del tpu
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
  topology = tf.tpu.experimental.initialize_tpu_system(resolver)
  assignment = tf.tpu.experimental.DeviceAssignment.build(
      topology, num_replicas=2, computation_shape=[1, 2, 1, 1])
  with pytest.raises(ValueError, match="2 cores.*model parallelism"):
    tf.distribute.TPUStrategy(resolver,
                              experimental_device_assignment=assignment)


def _lookup_step(tpu, embedding):
  def replica(ids):
    activations, preserved = embedding({"f": ids})
    embedding.apply_gradients(activations, preserved)
    return activations["f"]
  return lambda ids: tpu.run(replica, args=(ids,))


@SPARSECORE
@pytest.mark.parametrize("tpu", ["v5p-8"], indirect=True)
def test_jit_compile_and_a_second_strategy_are_refused_untouched(tpu):
  with tpu.scope():
    table = tfemb.TableConfig(8, 4, name="t",
                              initializer=tf.constant_initializer(0.5))
    embedding = tfemb.TPUEmbeddingV2(
        {"f": tfemb.FeatureConfig(table, output_shape=[2])}, tfemb.SGD(0.1))
    embedding.build()
  before = embedding.embedding_tables["t"].numpy()
  ids = tf.constant([1, 2], tf.int32)
  with pytest.raises(ValueError, match=r"XLA cannot compile.*"
                     r"jit_compile=True.*jit_compile=False"):
    tf.function(_lookup_step(tpu, embedding), jit_compile=True)(ids)
  other = tf.distribute.TPUStrategy(
      tf.distribute.cluster_resolver.TPUClusterResolver())
  with pytest.raises(ValueError, match=r"created under <HostTPUStrategy "
                     r"v5p-8.*used under <HostTPUStrategy.*one TPUStrategy"):
    tf.function(_lookup_step(other, embedding))(ids)
  np.testing.assert_array_equal(embedding.embedding_tables["t"].numpy(),
                                before)
