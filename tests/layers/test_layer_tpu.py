"""The Keras layer under a TPUStrategy hands its work to TensorFlow's engines.

No TPU exists here. A stand-in `TPUStrategy` (tests/tpu_stand_in.py)
reports each embedding feature, and TensorFlow's engine classes are replaced:
`TPUEmbedding` (V1) and `TPUEmbeddingV2` by recorders whose `dequeue` /
lookup returns known activations, so the gradients handed back can be
checked against a hand-computed d(loss)/d(activations); `TPUEmbeddingV0` by
TensorFlow's real class with a spy on its call (its dense lookup runs on the
CPU). The recorders create their tables with TensorFlow's own variable code
(`TPUEmbeddingBase._create_variables`), so checkpoint layouts compare.
Runs under Keras 3 and tf_keras.
"""

import copy

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_base  # pylint: disable=g-direct-tensorflow-import

import reference
import tfemb
import tfemb.layers
from tfemb import host as host_engine
from tfemb import tf_versions
from tfemb.tpu import delegate
from tpu_stand_in import assert_same_fields
from tpu_stand_in import EmbeddingFeature
from tpu_stand_in import StandInTPUStrategy
from tpu_stand_in import use_strategy

keras = tf.keras
tf_embedding = tf.tpu.experimental.embedding
KERAS_3 = keras.layers.Layer.__module__.startswith("keras.")
BATCH = 4
RNG = np.random.default_rng(5)


class _Recorder(tpu_embedding_base.TPUEmbeddingBase):
  """TensorFlow's config handling and variables; records every call."""

  log = None  # a list, set by the `log` fixture
  activations = None  # what a lookup returns: a function of feature_config

  def __init__(self, feature_config, optimizer, *args):
    # What was handed over, before TensorFlow's init fills in optimizers.
    self.handed = copy.copy((feature_config, optimizer) + args)
    self.handed_tables = {
        id(f.table): copy.copy(f.table)
        for f in tf.nest.flatten(feature_config)}
    super().__init__(feature_config, optimizer)
    self.log.append(("init", type(self).__name__))

  def _create_variables_and_slots(self):
    return {t.name: self._create_variables(t, trainable=False)
            for t in self._table_config}

  @property
  def embedding_tables(self):
    return {t: self._variables[t.name]["parameters"]
            for t in self._table_config}

  def _activations(self):
    return type(self).activations(self._feature_config)


class FakeV1(_Recorder):
  """`tf.tpu.experimental.embedding.TPUEmbedding`'s protocol."""

  def build(self, per_replica_input_shapes=None, per_replica_batch_size=None):
    self.log.append(("build", per_replica_input_shapes,
                     per_replica_batch_size))
    super().build()

  def enqueue(self, features, weights=None, training=True, name=None):
    self.log.append(("enqueue", name, training, features, weights))

  def dequeue(self, name=None):
    self.log.append(("dequeue", name))
    return self._activations()

  def apply_gradients(self, gradients, name=None):
    lrs = [t.optimizer.learning_rate for t in self._table_config]
    self.log.append(("apply_gradients", name, gradients,
                     [float(lr() if callable(lr) else lr) for lr in lrs]))

  def _retrieve_variables(self):
    self.log.append(("retrieve",))

  def _load_variables(self):
    self.log.append(("load",))


class FakeV2(_Recorder):
  """`TPUEmbeddingV2`'s protocol: `(activations, preserved) = engine(...)`;
  tables keyed by (stacked) table name."""

  def build(self, *args, **kwargs):
    self.log.append(("build", args, kwargs))
    super().build()

  def __call__(self, features, weights=None):
    preserved = {"stacked": tf.constant([7.0])}
    self.log.append(("lookup", features, weights, preserved))
    return self._activations(), preserved

  def apply_gradients(self, gradients, preserved_outputs=None):
    self.log.append(("apply_gradients", gradients, preserved_outputs))

  @property
  def embedding_tables(self):
    return {name: v["parameters"] for name, v in self._variables.items()}

  @property
  def variables(self):
    return self._variables


class SpyV0(tf_embedding.TPUEmbeddingV0):
  """TensorFlow's `TPUEmbeddingV0`, with its calls recorded."""

  log = None

  def __init__(self, feature_config, optimizer):
    self.handed = (feature_config, optimizer)
    super().__init__(feature_config, optimizer)
    self.log.append(("init", "SpyV0"))

  def build(self, *args, **kwargs):
    self.log.append(("build", args, kwargs))
    super().build()

  def __call__(self, features, weights=None):
    self.log.append(("lookup", features, weights))
    return super().__call__(features, weights)


ENGINES = {"TPUEmbedding": FakeV1, "TPUEmbeddingV2": FakeV2,
           "TPUEmbeddingV0": SpyV0}


@pytest.fixture(name="log")
def fixture_log(monkeypatch):
  """TensorFlow's engines replaced; yields the log of their calls."""
  log = []
  for name, cls in ENGINES.items():
    monkeypatch.setitem(delegate.TENSORFLOW_ENGINES, name, cls)
    monkeypatch.setattr(cls, "log", log)
  monkeypatch.setattr(_Recorder, "activations", staticmethod(known_activations))
  return log


def on_tpu(monkeypatch, feature):
  use_strategy(monkeypatch, StandInTPUStrategy(feature))


# --- the model: configs, features, known activations, a hand-made loss -----

def make_configs(output_shapes=False):
  users = tfemb.TableConfig(
      vocabulary_size=20, dim=4, name="users", combiner="sum",
      initializer=tf.constant_initializer(RNG.normal(size=(20, 4))),
      optimizer=tfemb.FTRL(0.2, beta=0.5, clipvalue=(-2.0, None)))
  items = tfemb.TableConfig(
      vocabulary_size=30, dim=3, name="items", combiner="sqrtn",
      initializer=tf.constant_initializer(RNG.normal(size=(30, 3))),
      quantization_config=tfemb.QuantizationConfig(256, -1.0, 1.0))
  shape = (lambda *s: list(s)) if output_shapes else (lambda *s: None)
  feature_config = {
      "user": tfemb.FeatureConfig(users, name="user",
                                  output_shape=shape(BATCH)),
      "items": [
          tfemb.FeatureConfig(items, name="item", output_shape=shape(BATCH)),
          tfemb.FeatureConfig(items, name="history", max_sequence_length=3,
                              output_shape=shape(BATCH, 3)),
      ],
  }
  optimizer = tfemb.Adagrad(0.1, clip_weight_min=-3.0)
  return feature_config, optimizer


def features():
  return {"user": tf.constant([[1], [2], [3], [1]], tf.int64),
          "items": [tf.constant([[4], [5], [6], [7]], tf.int64),
                    tf.ragged.constant([[1, 2], [], [3], [4, 5, 6, 7]],
                                       dtype=tf.int64)]}


# In tf.nest order: items/0 (item), items/1 (history), user.
_ACTIVATIONS = [RNG.normal(size=(BATCH, 3)), RNG.normal(size=(BATCH, 3, 3)),
                RNG.normal(size=(BATCH, 4))]
_COEFFICIENTS = [RNG.normal(size=a.shape) for a in _ACTIVATIONS]


def known_activations(feature_config):
  return tf.nest.pack_sequence_as(
      feature_config, [tf.constant(a, tf.float32) for a in _ACTIVATIONS])


def loss_of(activations, scale=1.0):
  """sum(scale * c * a^2) / 2, so d(loss)/d(a) = scale * c * a."""
  return sum(tf.reduce_sum(scale * c * tf.square(a)) / 2 for a, c in zip(
      tf.nest.flatten(activations), _COEFFICIENTS))


def expected_gradients(scale=1.0):
  return [scale * c * a for a, c in zip(_ACTIVATIONS, _COEFFICIENTS)]


def assert_gradients(gradients, expected, feature_config):
  tf.nest.assert_same_structure(gradients, feature_config)
  for got, want in zip(tf.nest.flatten(gradients), expected):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)


def train_step(layer, scale=1.0):
  """Looks up and differentiates the loss with respect to the layer's
  trainable weights (the trap: zero gradient, as tfrs returns)."""
  with tf.GradientTape() as tape:
    activations = layer(features())
    loss = loss_of(activations, scale)
  grads = tape.gradient(loss, layer.trainable_weights)
  return activations, grads


def assert_same_values(got, want):
  tf.nest.assert_same_structure(got, want, expand_composites=True)
  for a, b in zip(tf.nest.flatten(got, expand_composites=True),
                  tf.nest.flatten(want, expand_composites=True)):
    np.testing.assert_array_equal(a, b)


def calls(log, kind):
  return [entry for entry in log if entry[0] == kind]


# --- engine selection and hand-over ------------------------------------------

@pytest.mark.parametrize("hardware, requested, engine, args_after_optimizer", [
    (EmbeddingFeature.V1, None, FakeV1, (True,)),
    (EmbeddingFeature.V2, None, FakeV2, (True, "scc")),
    (EmbeddingFeature.UNSUPPORTED, None, SpyV0, ()),
    (EmbeddingFeature.V1, EmbeddingFeature.UNSUPPORTED, SpyV0, ()),
])
def test_each_embedding_feature_gets_tensorflows_engine(
    monkeypatch, log, hardware, requested, engine, args_after_optimizer):
  on_tpu(monkeypatch, hardware)
  feature_config, optimizer = make_configs(output_shapes=True)
  layer = tfemb.layers.TPUEmbedding(
      feature_config, optimizer, pipeline_execution_with_tensor_core=True,
      embedding_feature=requested, sparse_core_embedding_config="scc")
  assert type(layer._tpu_embedding) is engine  # pylint: disable=protected-access
  assert layer._embedding_feature == (requested or hardware)  # pylint: disable=protected-access
  assert calls(log, "init") == [("init", engine.__name__)]
  assert layer._tpu_embedding.handed[2:] == args_after_optimizer  # pylint: disable=protected-access
  assert layer.get_config()["pipeline_execution_with_tensor_core"] is True


def test_requesting_hardware_the_tpu_lacks_raises(monkeypatch, log):
  on_tpu(monkeypatch, EmbeddingFeature.V1)
  with pytest.raises(ValueError, match="embedding_feature=.*V2.*this TPU has"):
    tfemb.layers.TPUEmbedding(*make_configs(),
                              embedding_feature=EmbeddingFeature.V2)
  assert not log


@pytest.mark.parametrize("hardware", [EmbeddingFeature.V1,
                                      EmbeddingFeature.V2])
def test_configs_handed_over_equal_the_users_field_by_field(
    monkeypatch, log, hardware):
  on_tpu(monkeypatch, hardware)
  feature_config, optimizer = make_configs(output_shapes=True)
  user_tables = [dict(vars(f.table)) for f in tf.nest.flatten(feature_config)]
  layer = tfemb.layers.TPUEmbedding(feature_config, optimizer)
  engine = layer._tpu_embedding  # pylint: disable=protected-access
  handed_config, handed_optimizer = engine.handed[:2]
  tf.nest.assert_same_structure(handed_config, feature_config)
  assert_same_fields(optimizer, handed_optimizer, "optimizer")
  for ours, theirs in zip(tf.nest.flatten(feature_config),
                          tf.nest.flatten(handed_config)):
    assert type(theirs) is tf_embedding.FeatureConfig
    for field, value in vars(ours).items():
      if field != "table":
        assert vars(theirs)[field] == value, (ours.name, field)
    table = engine.handed_tables[id(theirs.table)]
    assert type(table) is tf_embedding.TableConfig
    for field, value in vars(ours.table).items():
      if field == "optimizer":  # without its own: the layer's
        assert_same_fields(value or optimizer, table.optimizer,
                            f"{ours.table.name}.optimizer")
      elif field == "quantization_config" and value is not None:
        assert_same_fields(value, table.quantization_config,
                            f"{ours.table.name}.quantization_config")
      elif f"TableConfig.{field}" in tf_versions.missing_here():
        assert field not in vars(table)  # this TensorFlow has no such field
      else:
        assert vars(table)[field] is value or vars(table)[field] == value, (
            ours.table.name, field)
  # Shared tables stay shared; the user's objects are untouched.
  assert handed_config["items"][0].table is handed_config["items"][1].table
  assert handed_config["user"].table is not handed_config["items"][0].table
  assert feature_config["items"][0].table.optimizer is None
  assert user_tables == [vars(f.table) for f in tf.nest.flatten(
      feature_config)]


def test_v2_needs_output_shapes_at_construction(monkeypatch, log):
  on_tpu(monkeypatch, EmbeddingFeature.V2)
  with pytest.raises(ValueError, match=r"Feature 'items/0'.*TPUEmbeddingV2.*"
                     r"output_shape.*got <unknown>"):
    tfemb.layers.TPUEmbedding(*make_configs(output_shapes=False))
  assert not log


# --- build ------------------------------------------------------------------

def test_v1_builds_with_the_input_shapes(monkeypatch, log):
  on_tpu(monkeypatch, EmbeddingFeature.V1)
  layer = tfemb.layers.TPUEmbedding(*make_configs())
  train_step(layer)
  ((_, shapes, batch_size),) = calls(log, "build")
  assert batch_size is None
  # One TensorShape per feature, as TensorFlow's build flattens them.
  assert tf.nest.flatten(shapes) == [  # items/0, items/1 (ragged), user
      tf.TensorShape([BATCH, 1]), tf.TensorShape([BATCH, None]),
      tf.TensorShape([BATCH, 1])]
  assert sorted(shapes) == ["items", "user"] and len(shapes["items"]) == 2


def test_v1_builds_with_the_batch_size_if_given(monkeypatch, log):
  on_tpu(monkeypatch, EmbeddingFeature.V1)
  layer = tfemb.layers.TPUEmbedding(*make_configs(), batch_size=16)
  train_step(layer)
  assert calls(log, "build") == [("build", None, 16)]


@pytest.mark.parametrize("hardware", [EmbeddingFeature.V2,
                                      EmbeddingFeature.UNSUPPORTED])
def test_v2_and_v0_build_without_arguments(monkeypatch, log, hardware):
  on_tpu(monkeypatch, hardware)
  layer = tfemb.layers.TPUEmbedding(*make_configs(output_shapes=True),
                                    batch_size=16)
  layer(features())
  assert calls(log, "build") == [("build", (), {})]


@pytest.mark.parametrize("hardware", [EmbeddingFeature.V1,
                                      EmbeddingFeature.V2])
def test_v1_and_v2_train_through_the_dummy_weight(monkeypatch, log, hardware):
  on_tpu(monkeypatch, hardware)
  layer = tfemb.layers.TPUEmbedding(*make_configs(output_shapes=True))
  _, grads = train_step(layer)
  assert [w.name.split("/")[-1].split(":")[0]
          for w in layer.trainable_weights] == ["tpu_embedding_helper_dummy"]
  assert tuple(layer.trainable_weights[0].shape) == (1,)
  np.testing.assert_array_equal(grads[0], [0.0])


# --- calls and gradients ------------------------------------------------------

def test_v1_enqueue_dequeue_apply_gradients_share_a_call_id(monkeypatch, log):
  on_tpu(monkeypatch, EmbeddingFeature.V1)
  feature_config, optimizer = make_configs()
  layer = tfemb.layers.TPUEmbedding(feature_config, optimizer)
  batch = features()
  weights = tf.nest.map_structure(lambda _: None, batch)
  with tf.GradientTape() as tape:
    activations = layer(batch, weights)
    loss = loss_of(activations)
  protocol = [e[:2] for e in log if e[0] != "init" and e[0] != "build"]
  assert protocol == [("enqueue", "1"), ("dequeue", "1")]
  (enqueue,) = calls(log, "enqueue")
  assert enqueue[2] is True  # training=True, as tfrs: TF's pass decides
  assert_same_values(enqueue[3], batch)
  assert enqueue[4] == weights
  assert_gradients(activations, _ACTIVATIONS, feature_config)
  tape.gradient(loss, layer.trainable_weights)
  ((_, name, gradients, _),) = calls(log, "apply_gradients")
  assert name == "1"
  assert_gradients(gradients, expected_gradients(), feature_config)


def test_v1_two_calls_in_one_step_keep_their_own_gradients(monkeypatch, log):
  on_tpu(monkeypatch, EmbeddingFeature.V1)
  feature_config, optimizer = make_configs()
  layer = tfemb.layers.TPUEmbedding(feature_config, optimizer)
  with tf.GradientTape() as tape:
    loss = loss_of(layer(features()), 2.0) + loss_of(layer(features()), -3.0)
  tape.gradient(loss, layer.trainable_weights)
  applied = {name: grads for _, name, grads, _ in calls(log, "apply_gradients")}
  assert sorted(applied) == ["1", "2"]
  assert_gradients(applied["1"], expected_gradients(2.0), feature_config)
  assert_gradients(applied["2"], expected_gradients(-3.0), feature_config)
  assert [e[1] for e in calls(log, "enqueue")] == ["1", "2"]
  assert [e[1] for e in calls(log, "dequeue")] == ["1", "2"]


def test_v1_in_a_tf_function(monkeypatch, log):
  on_tpu(monkeypatch, EmbeddingFeature.V1)
  feature_config, optimizer = make_configs()
  layer = tfemb.layers.TPUEmbedding(feature_config, optimizer)
  layer(features())  # built eagerly: call id 1
  tf.function(lambda: train_step(layer)[1])()
  protocol = [e[:2] for e in log if e[0] not in ("init", "build")]
  assert protocol == [("enqueue", "1"), ("dequeue", "1"), ("enqueue", "2"),
                      ("dequeue", "2"), ("apply_gradients", "2")]
  ((_, _, gradients, _),) = calls(log, "apply_gradients")
  assert all(isinstance(g, tf.Tensor) and g.graph is not None
             for g in tf.nest.flatten(gradients))


def test_v2_hands_the_preserved_outputs_back(monkeypatch, log):
  on_tpu(monkeypatch, EmbeddingFeature.V2)
  feature_config, optimizer = make_configs(output_shapes=True)
  layer = tfemb.layers.TPUEmbedding(feature_config, optimizer)
  activations, _ = train_step(layer)
  assert_gradients(activations, _ACTIVATIONS, feature_config)
  ((_, looked_up, weights, preserved),) = calls(log, "lookup")
  assert_same_values(looked_up, features())
  assert weights is None
  ((_, gradients, preserved_back),) = calls(log, "apply_gradients")
  assert preserved_back is preserved
  assert_gradients(gradients, expected_gradients(), feature_config)
  assert not calls(log, "enqueue") and not calls(log, "dequeue")


@pytest.mark.parametrize("hardware", [EmbeddingFeature.V1,
                                      EmbeddingFeature.V2])
def test_under_loss_scaling_tensorflows_engine_gets_the_unscaled_gradient(
    monkeypatch, log, hardware):
  """Keras' loss scaling (mixed_float16) multiplies the loss by its scale;
  the layer divides the gradient it hands TensorFlow's engine by it
  (docs/keras_layer.md, "Mixed precision")."""
  # Created first: tf_keras' refuses the stand-in strategy.
  scaling = keras.mixed_precision.LossScaleOptimizer(
      keras.optimizers.SGD(0.1), initial_scale=1024.0)
  on_tpu(monkeypatch, hardware)
  feature_config, optimizer = make_configs(output_shapes=True)
  layer = tfemb.layers.TPUEmbedding(feature_config, optimizer)
  scale_loss = scaling.scale_loss if KERAS_3 else scaling.get_scaled_loss
  with tf.GradientTape() as tape:
    loss = scale_loss(loss_of(layer(features())))
  tape.gradient(loss, layer.trainable_weights)
  (applied,) = calls(log, "apply_gradients")
  gradients = applied[2] if hardware == EmbeddingFeature.V1 else applied[1]
  assert_gradients(gradients, expected_gradients(), feature_config)


def _dense_features():
  # TensorFlow's V0 looks dense ids up on the CPU; ragged/sparse inputs
  # need TPU outside compilation.
  return {"user": tf.constant([1, 2, 1], tf.int64),
          "items": [tf.constant([4, 5, 4], tf.int64),
                    tf.constant([6, 7, 8], tf.int64)]}


def _v0_configs():
  feature_config, optimizer = make_configs()
  feature_config["items"][1] = tfemb.FeatureConfig(
      feature_config["items"][0].table, name="history")
  return feature_config, optimizer


def test_v0_calls_tensorflows_lookup_and_keras_trains_the_tables(
    monkeypatch, log):
  on_tpu(monkeypatch, EmbeddingFeature.UNSUPPORTED)
  feature_config, optimizer = _v0_configs()
  layer = tfemb.layers.TPUEmbedding(feature_config, optimizer)
  batch = _dense_features()
  layer(batch)  # builds
  tables = layer.embedding_tables
  users, items = feature_config["user"].table, feature_config["items"][0].table
  before = {t: v.numpy().copy() for t, v in tables.items()}
  # The tables are the layer's trainable weights; no dummy.
  assert {id(w) for w in layer.trainable_weights} == {
      id(v) for v in tables.values()}
  with tf.GradientTape() as tape:
    activations = layer(batch)
    loss = (tf.reduce_sum(activations["user"]) +
            2.0 * tf.reduce_sum(activations["items"][0]) +
            3.0 * tf.reduce_sum(activations["items"][1]))
  ((_, looked_up, weights),) = calls(log, "lookup")[1:]
  assert_same_values(looked_up, batch)
  assert weights is None
  np.testing.assert_allclose(activations["user"],
                             before[users][[1, 2, 1]], rtol=1e-6)
  grads = tape.gradient(loss, layer.trainable_weights)
  monkeypatch.undo()  # the stand-in cannot run a Keras optimizer
  keras.optimizers.SGD(0.5).apply_gradients(zip(grads, layer.trainable_weights))
  # The Keras optimizer's rule (w -= 0.5 * g), not the embedding optimizer's.
  # Numerically the same as SGD on each row's summed gradient.
  for table, pairs in (
      (users, [(i, 1.0) for i in (1, 2, 1)]),
      (items, [(4, 2.0), (5, 2.0), (4, 2.0), (6, 3.0), (7, 3.0), (8, 3.0)])):
    oracle = reference.Table(before[table], "sgd", {})
    oracle.apply(reference.row_gradients(pairs), 0.5)
    np.testing.assert_allclose(tables[table].numpy(), oracle.w, rtol=1e-6)


# --- strategies -------------------------------------------------------------

def test_created_off_tpu_called_under_tpu_raises(monkeypatch, log):
  layer = tfemb.layers.TPUEmbedding(*make_configs(), name="emb")
  layer(features())  # built off TPU
  on_tpu(monkeypatch, EmbeddingFeature.V1)
  with pytest.raises(RuntimeError, match="'emb' was created under strategy "
                     ".*_DefaultDistributionStrategy.*called under a "
                     "TPUStrategy"):
    layer(features())
  assert not log


def test_created_under_tpu_called_off_tpu_raises(monkeypatch, log):
  on_tpu(monkeypatch, EmbeddingFeature.V1)
  layer = tfemb.layers.TPUEmbedding(*make_configs(), name="emb")
  layer(features())  # built under the TPU
  monkeypatch.undo()
  with pytest.raises(RuntimeError, match="'emb' was created under strategy "
                     "StandInTPUStrategy.*called under strategy .*Default.*"
                     "strategy.run"):
    layer(features())
  assert len(calls(log, "enqueue")) == 1


@pytest.mark.parametrize("make_strategy", [
    tf.distribute.get_strategy,
    lambda: tf.distribute.MirroredStrategy(["/cpu:0"]),
], ids=["default", "mirrored"])
def test_off_tpu_the_layer_keeps_the_host_engine(log, make_strategy):
  strategy = make_strategy()
  feature_config, optimizer = make_configs()
  with strategy.scope():
    layer = tfemb.layers.TPUEmbedding(feature_config, optimizer)
    layer(features())  # built in cross-replica context
  assert isinstance(layer._tpu_embedding, host_engine.HostEmbedding)  # pylint: disable=protected-access
  strategy.run(lambda: train_step(layer))
  assert not log
  assert [w.name.split("/")[-1].split(":")[0]
          for w in layer.trainable_weights] == ["tpu_embedding_helper_dummy"]


# --- tables, saving, config -------------------------------------------------

@pytest.mark.parametrize("hardware", [EmbeddingFeature.V1,
                                      EmbeddingFeature.UNSUPPORTED])
def test_embedding_tables_are_keyed_by_the_users_configs(
    monkeypatch, log, hardware):
  on_tpu(monkeypatch, hardware)
  feature_config, optimizer = _v0_configs()
  layer = tfemb.layers.TPUEmbedding(feature_config, optimizer)
  layer(_dense_features())
  engine = layer._tpu_embedding  # pylint: disable=protected-access
  users, items = feature_config["user"].table, feature_config["items"][0].table
  tables = layer.embedding_tables
  assert [id(t) for t in tables] == [id(items), id(users)]
  assert tables[users] is engine._variables["users"]["parameters"]  # pylint: disable=protected-access
  assert tables[items] is engine._variables["items"]["parameters"]  # pylint: disable=protected-access
  variables = layer.embedding_variables
  assert [id(t) for t in variables] == [id(items), id(users)]
  assert sorted(variables[users]) == ["accumulators", "linears", "parameters"]
  assert sorted(variables[items]) == ["accumulators", "parameters"]
  assert variables[items]["accumulators"] is (
      engine._variables["items"]["accumulators"])  # pylint: disable=protected-access


def test_v2_tables_are_tensorflows_stacked_tables(monkeypatch, log):
  on_tpu(monkeypatch, EmbeddingFeature.V2)
  layer = tfemb.layers.TPUEmbedding(*make_configs(output_shapes=True))
  train_step(layer)
  engine = layer._tpu_embedding  # pylint: disable=protected-access
  assert layer.embedding_tables == engine.embedding_tables
  assert layer.embedding_variables is engine.variables


def _checkpoint_keys(tmp_path, layer, name):
  path = tf.train.Checkpoint(layer=layer).save(str(tmp_path / name))
  return sorted(k for k, _ in tf.train.list_variables(path)
                if "_CHECKPOINTABLE_OBJECT_GRAPH" not in k)


def test_checkpoint_layout_is_the_cpu_layout(monkeypatch, log, tmp_path):
  feature_config, optimizer = _v0_configs()
  cpu = tfemb.layers.TPUEmbedding(feature_config, optimizer)
  cpu(_dense_features())
  cpu_keys = _checkpoint_keys(tmp_path, cpu, "cpu")
  assert any(k.startswith("layer/_tpu_embedding/users/") for k in cpu_keys)
  for hardware in (EmbeddingFeature.V1, EmbeddingFeature.UNSUPPORTED):
    with monkeypatch.context() as patch:
      on_tpu(patch, hardware)
      tpu = tfemb.layers.TPUEmbedding(feature_config, optimizer)
      tpu(_dense_features())
    assert _checkpoint_keys(tmp_path, tpu, str(hardware)) == cpu_keys, hardware


def test_get_config_is_the_cpu_one(monkeypatch, log):
  feature_config, optimizer = make_configs()
  cpu = tfemb.layers.TPUEmbedding(feature_config, optimizer, True,
                                  batch_size=4, name="emb")
  on_tpu(monkeypatch, EmbeddingFeature.V1)
  tpu = tfemb.layers.TPUEmbedding(feature_config, optimizer, True,
                                  batch_size=4, name="emb")
  assert tpu.get_config() == cpu.get_config()
  assert tpu.get_config()["pipeline_execution_with_tensor_core"] is True


@pytest.mark.parametrize("hardware, first_table", [
    (EmbeddingFeature.V1, 1),  # after the dummy
    (EmbeddingFeature.UNSUPPORTED, 0),  # V0's tables are Keras weights: once
])
def test_keras_saving_lists_the_tables_and_slots(monkeypatch, log, hardware,
                                                 first_table):
  on_tpu(monkeypatch, hardware)
  feature_config, optimizer = _v0_configs()
  layer = tfemb.layers.TPUEmbedding(feature_config, optimizer)
  layer(_dense_features())
  store = {}
  layer.save_own_variables(store)
  variables = layer.embedding_variables
  items, users = feature_config["items"][0].table, feature_config["user"].table
  # By table: parameters first, then the slots by name.
  saved = [variables[items]["parameters"], variables[items]["accumulators"],
           variables[users]["parameters"], variables[users]["accumulators"],
           variables[users]["linears"]]
  assert len(store) == first_table + len(saved)
  for i, v in enumerate(saved):
    np.testing.assert_array_equal(store[str(first_table + i)], v)
  users_at = str(first_table + 2)
  store[users_at] = store[users_at] + 1.0
  layer.load_own_variables(store)
  np.testing.assert_array_equal(variables[users]["parameters"],
                                store[users_at])


def test_v1_keras_saving_pulls_and_pushes_the_tables(monkeypatch, log):
  """As TensorFlow's checkpoint hooks: retrieve from the TPU before reading
  the variables, load onto it after writing them."""
  on_tpu(monkeypatch, EmbeddingFeature.V1)
  layer = tfemb.layers.TPUEmbedding(*make_configs())
  train_step(layer)
  store = {}
  layer.save_own_variables(store)
  assert log[-1] == ("retrieve",)
  layer.load_own_variables(store)
  assert log[-1] == ("load",)
  assert len(calls(log, "retrieve")) == len(calls(log, "load")) == 1


def test_keras_learning_rate_schedules_count_tpu_steps(monkeypatch, log):
  on_tpu(monkeypatch, EmbeddingFeature.V1)
  feature_config, _ = make_configs()
  schedule = keras.optimizers.schedules.PiecewiseConstantDecay(
      [0], [0.5, 0.25])  # step 0: 0.5, then 0.25
  layer = tfemb.layers.TPUEmbedding(feature_config,
                                    keras.optimizers.SGD(schedule))
  train_step(layer)
  train_step(layer)
  # Tables: items (the layer's, from the schedule), users (own FTRL 0.2).
  assert [e[3] for e in calls(log, "apply_gradients")] == [
      [0.5, 0.2], [0.25, 0.2]]
  assert int(layer.embedding_iterations.numpy()) == 2


@pytest.mark.parametrize("hardware, engine_class", [
    (EmbeddingFeature.V1, "tpu_embedding_v2.TPUEmbedding"),
    (EmbeddingFeature.V2, "tpu_embedding_v3.TPUEmbeddingV2"),
    (EmbeddingFeature.UNSUPPORTED, "tpu_embedding_v1.TPUEmbeddingV0"),
])
def test_tensorflows_own_engines_accept_what_the_layer_hands_over(
    monkeypatch, hardware, engine_class):
  """TensorFlow's real constructors (they run no TPU op), with a Keras
  optimizer translated to a dynamic learning rate."""
  on_tpu(monkeypatch, hardware)
  feature_config, _ = make_configs(output_shapes=True)
  schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
  layer = tfemb.layers.TPUEmbedding(feature_config,
                                    keras.optimizers.Adagrad(schedule))
  engine = layer._tpu_embedding  # pylint: disable=protected-access
  cls = type(engine)
  assert f"{cls.__module__}.{cls.__name__}" == (
      f"tensorflow.python.tpu.{engine_class}")
  optimizers = {t.name: t.optimizer for t in engine._table_config}  # pylint: disable=protected-access
  assert {n: type(o) for n, o in optimizers.items()} == {
      "items": tf_embedding.Adagrad, "users": tf_embedding.FTRL}
  assert callable(optimizers["items"].learning_rate)
