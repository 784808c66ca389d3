"""The TPU delegate: engine selection and config hand-over, without a TPU.

A stand-in `TPUStrategy` (tests/tpu_stand_in.py) reports each embedding
feature; TensorFlow's engine classes are replaced by recorders, so no TPU op
runs. `test_tensorflows_own_engines_accept_the_hand_over` constructs the real
classes (their constructors run no TPU op).
"""

import pytest
import tensorflow as tf

import tfemb
from tfemb import host as host_engine
from tfemb.tpu import delegate
from tpu_stand_in import assert_same_fields
from tpu_stand_in import EmbeddingFeature
from tpu_stand_in import StandInTPUStrategy
from tpu_stand_in import use_strategy

tf_embedding = tf.tpu.experimental.embedding
ENGINES = ("TPUEmbedding", "TPUEmbeddingV2", "TPUEmbeddingV0")


class _Recorder:
  """Stands in for one of TensorFlow's engine classes; records the call."""

  def __init__(self, engine, calls, *args):
    self.engine = engine
    self.args = args
    calls.append(self)


@pytest.fixture(name="calls")
def fixture_calls(monkeypatch):
  """Replaces TensorFlow's engines by recorders; yields the recorded calls."""
  calls = []
  for name in ENGINES:
    monkeypatch.setitem(
        delegate.TENSORFLOW_ENGINES, name,
        lambda *args, _name=name: _Recorder(_name, calls, *args))
  return calls


def _tfemb_config():
  """Every kind of field: shared table, sequence, output_shape, names,
  quantization, per-table and global optimizers, dynamic learning rate."""
  items = tfemb.TableConfig(
      vocabulary_size=1000, dim=8, name="items", combiner="sqrtn",
      initializer=tf.constant_initializer(0.5),
      quantization_config=tfemb.QuantizationConfig(256, -1.0, 1.0))
  users = tfemb.TableConfig(
      vocabulary_size=50, dim=4, name="users", combiner="sum",
      optimizer=tfemb.FTRL(
          learning_rate=lambda: 0.2, learning_rate_power=-0.3,
          l1_regularization_strength=0.01, beta=0.5,
          multiply_linear_by_learning_rate=True, allow_zero_accumulator=True,
          clipvalue=(-2.0, None), weight_decay_factor=0.1,
          multiply_weight_decay_factor_by_learning_rate=True))
  feature_config = {
      "item": tfemb.FeatureConfig(items, name="item"),
      "history": tfemb.FeatureConfig(items, max_sequence_length=5,
                                     validate_weights_and_indices=False),
      "user": [tfemb.FeatureConfig(users, output_shape=[16])],
  }
  optimizer = tfemb.Adam(0.05, beta_1=0.8, lazy_adam=False,
                         sum_inside_sqrt=False, clip_weight_min=-3.0,
                         low_dimensional_packing_status=True)
  return feature_config, optimizer


@pytest.mark.parametrize("feature, engine, args_after_optimizer", [
    (EmbeddingFeature.V1, "TPUEmbedding", (True,)),
    (EmbeddingFeature.V2, "TPUEmbeddingV2", (True, None)),
    (EmbeddingFeature.UNSUPPORTED, "TPUEmbeddingV0", ()),
])
def test_each_embedding_feature_picks_tensorflows_engine(
    monkeypatch, calls, feature, engine, args_after_optimizer):
  use_strategy(monkeypatch, StandInTPUStrategy(feature))
  feature_config, optimizer = _tfemb_config()
  result = tfemb.TPUEmbedding(feature_config, optimizer,
                              pipeline_execution_with_tensor_core=True)
  assert calls == [result]
  assert result.engine == engine
  assert result.args[2:] == args_after_optimizer


def test_configs_handed_over_equal_the_tfemb_ones_field_by_field(
    monkeypatch, calls):
  use_strategy(monkeypatch, StandInTPUStrategy(EmbeddingFeature.V1))
  feature_config, optimizer = _tfemb_config()
  tfemb.TPUEmbedding(feature_config, optimizer)
  handed_config, handed_optimizer, _ = calls[0].args
  tf.nest.assert_same_structure(handed_config, feature_config)
  for ours, theirs in zip(tf.nest.flatten(feature_config),
                          tf.nest.flatten(handed_config)):
    assert_same_fields(ours, theirs, ours.name or repr(ours.table.name))
  assert_same_fields(optimizer, handed_optimizer, "optimizer")
  # The shared table stays one TableConfig; the dynamic rate the same callable.
  assert handed_config["item"].table is handed_config["history"].table
  assert handed_config["item"].table is not handed_config["user"][0].table
  assert (handed_config["user"][0].table.optimizer.learning_rate is
          feature_config["user"][0].table.optimizer.learning_rate)
  # The user's tfemb objects are untouched (TensorFlow fills in its copies).
  assert feature_config["item"].table.optimizer is None


def test_tensorflows_configs_pass_through_unchanged(monkeypatch, calls):
  use_strategy(monkeypatch, StandInTPUStrategy(EmbeddingFeature.V2))
  table = tf_embedding.TableConfig(vocabulary_size=10, dim=2, name="t")
  feature_config = (tf_embedding.FeatureConfig(table),
                    tf_embedding.FeatureConfig(table, max_sequence_length=2))
  optimizer = tf_embedding.Adagrad(0.1)
  # Before 2.17 TensorFlow has no SparseCoreEmbeddingConfig: None passes.
  scc = (tf_embedding.SparseCoreEmbeddingConfig(max_ids_per_chip_per_sample=8)
         if hasattr(tf_embedding, "SparseCoreEmbeddingConfig") else None)
  delegate.make_tpu_embedding(feature_config, optimizer, False,
                              sparse_core_embedding_config=scc)
  handed_config, handed_optimizer, pipeline, handed_scc = calls[0].args
  assert all(a is b for a, b in zip(handed_config, feature_config))
  assert handed_optimizer is optimizer
  assert pipeline is False
  assert handed_scc is scc


@pytest.mark.parametrize("make_strategy", [
    tf.distribute.get_strategy,
    lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    lambda: tf.distribute.MirroredStrategy(["/cpu:0"]),
], ids=["default", "one_device", "mirrored"])
def test_off_tpu_strategies_get_the_host_engine(calls, make_strategy):
  strategy = make_strategy()
  feature_config, optimizer = _tfemb_config()
  with strategy.scope():
    embedding = tfemb.TPUEmbedding(feature_config, optimizer)
  assert isinstance(embedding, tfemb.TPUEmbedding)
  assert isinstance(embedding, host_engine.HostEmbedding)
  assert not calls
  assert not delegate.on_tpu(strategy)


@pytest.mark.parametrize("base", [tf.distribute.TPUStrategy,
                                  tf.distribute.experimental.TPUStrategy])
def test_both_tpu_strategy_classes_count(base):
  subclass = type("SomeTPUStrategy", (base,), {})
  assert delegate.on_tpu(object.__new__(subclass))
  assert not delegate.on_tpu(object.__new__(tf.distribute.Strategy))


@pytest.mark.parametrize("hardware, requested, engine", [
    (EmbeddingFeature.V1, EmbeddingFeature.UNSUPPORTED, "TPUEmbeddingV0"),
    (EmbeddingFeature.V2, EmbeddingFeature.UNSUPPORTED, "TPUEmbeddingV0"),
    (EmbeddingFeature.V1, EmbeddingFeature.V1, "TPUEmbedding"),
    (EmbeddingFeature.V2, EmbeddingFeature.V2, "TPUEmbeddingV2"),
])
def test_requested_embedding_feature(calls, hardware, requested, engine):
  feature_config, optimizer = _tfemb_config()
  result = delegate.make_tpu_embedding(
      feature_config, optimizer, strategy=StandInTPUStrategy(hardware),
      embedding_feature=requested)
  assert result.engine == engine


def test_requesting_hardware_the_tpu_lacks_raises(calls):
  feature_config, optimizer = _tfemb_config()
  with pytest.raises(ValueError, match="embedding_feature=.*V2.*this TPU has "
                     "embedding feature EmbeddingFeature.V1"):
    delegate.make_tpu_embedding(
        feature_config, optimizer,
        strategy=StandInTPUStrategy(EmbeddingFeature.V1),
        embedding_feature=EmbeddingFeature.V2)
  assert not calls


def test_the_delegate_refuses_a_non_tpu_strategy(calls):
  feature_config, optimizer = _tfemb_config()
  with pytest.raises(ValueError, match="needs a TPUStrategy, got "
                     "_DefaultDistributionStrategy"):
    delegate.make_tpu_embedding(feature_config, optimizer)
  assert not calls


def test_the_tpu_path_takes_the_host_paths_arguments(monkeypatch, calls):
  use_strategy(monkeypatch, StandInTPUStrategy(EmbeddingFeature.V1))
  feature_config, optimizer = _tfemb_config()
  result = tfemb.TPUEmbedding(optimizer=optimizer,
                              feature_config=feature_config)
  assert result.args[2] is False  # pipeline_execution_with_tensor_core
  with pytest.raises(TypeError):
    tfemb.TPUEmbedding(feature_config, optimizer, False, "extra")


@pytest.mark.parametrize("feature, engine_class", [
    (EmbeddingFeature.V1, "tpu_embedding_v2.TPUEmbedding"),
    (EmbeddingFeature.V2, "tpu_embedding_v3.TPUEmbeddingV2"),
    (EmbeddingFeature.UNSUPPORTED, "tpu_embedding_v1.TPUEmbeddingV0"),
])
def test_tensorflows_own_engines_accept_the_hand_over(monkeypatch, feature,
                                                      engine_class):
  use_strategy(monkeypatch, StandInTPUStrategy(feature))
  items = tfemb.TableConfig(vocabulary_size=100, dim=8, name="items")
  users = tfemb.TableConfig(vocabulary_size=30, dim=8, name="users",
                            optimizer=tfemb.SGD(0.5))
  embedding = tfemb.TPUEmbedding(
      {"item": tfemb.FeatureConfig(items, output_shape=[16]),
       "history": tfemb.FeatureConfig(items, max_sequence_length=3,
                                      output_shape=[16, 3]),
       "user": tfemb.FeatureConfig(users, output_shape=[16])},
      tfemb.Adagrad(0.1))
  module, name = engine_class.split(".")
  assert type(embedding).__module__ == f"tensorflow.python.tpu.{module}"
  assert type(embedding).__name__ == name
  tables = {t.name: t for t in embedding._table_config}  # pylint: disable=protected-access
  assert sorted(tables) == ["items", "users"]
  assert isinstance(tables["items"].optimizer, tf_embedding.Adagrad)
  assert isinstance(tables["users"].optimizer, tf_embedding.SGD)
