"""`tfemb.tf_versions`: what each supported TensorFlow has, checked against
the installed one, and the errors a configuration gets where it lacks it.

Tests that depend on the installed TensorFlow assert, on each version, what
that version must do: the newer branch converts, the older one refuses with
the version error.
"""

import importlib.util
import inspect

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
from tfemb import sparsecore_backports
from tfemb import tf_conversion
from tfemb import tf_versions
from tfemb.layers import keras_versions
from tfemb.tpu import delegate
from tpu_stand_in import EmbeddingFeature
from tpu_stand_in import StandInTPUStrategy
from tpu_stand_in import use_strategy

tf_embedding = tf.tpu.experimental.embedding
INSTALLED = tf_versions.version_tuple(tf.__version__)[:2]
_has = tf_versions.at_least


def test_the_installed_tensorflow_is_in_the_supported_range():
  assert (tf_versions.version_tuple(tf_versions.OLDEST) <= INSTALLED <=
          tf_versions.version_tuple(tf_versions.NEWEST))


@pytest.mark.parametrize("feature", sorted(tf_versions.ADDED_IN))
def test_added_in_matches_the_installed_tensorflow(feature):
  """Each entry is present exactly from its version on (here: the installed
  TensorFlow, on the side of the entry's version it falls)."""
  since = tf_versions.ADDED_IN[feature]
  if "." in feature:
    name, argument = feature.split(".")
    cls = getattr(tf_embedding, name, None)
    present = cls is not None and argument in inspect.signature(
        cls.__init__).parameters
  else:
    present = hasattr(tf_embedding, feature)
  assert present == _has(since), (feature, since, tf.__version__)


class _Old:
  """A TensorFlow class before an argument was added."""

  def __init__(self, a, b=1):
    self.a, self.b = a, b


class _New:
  """The same class once `c` was added (the reference signature)."""

  def __init__(self, a, b=1, c=tf.float32):
    del a, b, c


def test_construct_drops_a_missing_argument_at_its_default():
  made = tf_versions.construct(_Old, dict(a=3, b=4, c=tf.float32), "x",
                               reference=_New)
  assert (type(made), made.a, made.b) == (_Old, 3, 4)


def test_construct_names_the_feature_and_the_version_it_needs():
  table_config = type("TableConfig", (_Old,), {})
  with pytest.raises(tf_versions.TensorFlowVersionError) as error:
    tf_versions.construct(table_config, dict(a=3, dtype=tf.int32),
                          "Table 't'", reference=_New)
  assert str(error.value) == (
      "Table 't' (dtype=tf.int32) needs TableConfig.dtype, which TensorFlow "
      f"has from version 2.20 on; the installed TensorFlow is "
      f"{tf.__version__} (tfemb supports 2.16 to 2.21).")


def test_construct_refuses_to_drop_an_unknown_argument():
  with pytest.raises(ValueError, match="this TensorFlow's _Old has no "
                     "argument 'c' .* cannot be converted losslessly"):
    tf_versions.construct(_Old, dict(a=3, c=tf.int32), "x", reference=_New)


def test_a_table_dtype_converts_where_tensorflow_has_it():
  table = tfemb.TableConfig(10, 4, name="t", dtype=tf.int32)
  if _has("2.20"):
    assert tfemb.to_tensorflow(table).dtype == tf.int32
  else:
    with pytest.raises(tf_versions.TensorFlowVersionError,
                       match=r"Table 't' \(dtype=tf.int32\) needs "
                       r"TableConfig.dtype, which TensorFlow has from "
                       r"version 2.20"):
      tfemb.to_tensorflow(table)
  # float32, the default, converts everywhere.
  converted = tfemb.to_tensorflow(tfemb.TableConfig(10, 4, name="t"))
  assert type(converted) is tf_embedding.TableConfig
  assert (converted.vocabulary_size, converted.dim) == (10, 4)


def _backport_optimizer(**kwargs):
  return sparsecore_backports.CustomOptimizer(
      helpers.sgd_computation, learning_rate=0.3, slot_names=["v"],
      slot_initializers=[tf.zeros_initializer()], hyperparameters=[0.5],
      **kwargs)


def test_a_backported_custom_optimizer_converts_where_tensorflow_has_it():
  optimizer = _backport_optimizer()
  if not _has("2.18"):
    with pytest.raises(tf_versions.TensorFlowVersionError,
                       match="needs CustomOptimizer, which TensorFlow has "
                       "from version 2.18"):
      tfemb.to_tensorflow(optimizer)
    return
  converted = tfemb.to_tensorflow(optimizer)
  assert type(converted) is tf_embedding.CustomOptimizer
  assert converted.custom_computation is helpers.sgd_computation
  assert converted.learning_rate == 0.3
  assert converted._slot_names() == ["v"]
  assert converted.hyperparameters == (0.5,)


def _another_release(name):
  """The class `name` as another TensorFlow release defines it: in
  TensorFlow's TPU package, another class object than any tfemb imported
  (2.21's, from tfemb's copy, loaded again as a module of TensorFlow)."""
  spec = importlib.util.spec_from_file_location(
      "tensorflow.python.tpu.another_release", sparsecore_backports.__file__)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return getattr(module, name)


@pytest.mark.requires_tensorflow("2.18")
@pytest.mark.parametrize("release", ["installed", "another"])
def test_tensorflows_own_custom_optimizer_trains_a_v2_table(release):
  """TensorFlow's `CustomOptimizer` as a script for the installed release
  writes it (2.18 to 2.20: its own class, older than tfemb's), or for
  another release: recognised by name, whatever the class object."""
  cls = (tf_embedding.CustomOptimizer if release == "installed" else
         _another_release("CustomOptimizer"))
  optimizer = cls(helpers.sgd_computation, learning_rate=0.5)
  assert tfemb.optimizers.is_custom(optimizer)
  table = tfemb.TableConfig(8, 4, initializer=tf.ones_initializer(),
                            name="t")
  feature = {"f": tfemb.FeatureConfig(table, output_shape=[4])}
  embedding = tfemb.TPUEmbeddingV2(feature, optimizer)
  ids = tf.constant([1, 1, 3, 5], tf.int64)
  _, preserved = embedding({"f": ids})
  embedding.apply_gradients({"f": tf.fill([4, 4], 0.25)}, preserved)
  want = reference.Table(np.ones([8, 4]), "sgd", {})
  want.apply(reference.row_gradients(  # summed per row, then the rule
      zip([1, 1, 3, 5], np.full([4, 4], 0.25))), 0.5)
  want = want.w
  proto = embedding.embedding_layouts["t"]  # id i's row in the stack
  i, n = np.arange(8), proto.num_sparse_cores
  rows = (((i % n + proto.sparse_core_shard_rotation) % n) *
          proto.total_rows_per_sparse_core_shard +
          proto.sparse_core_shard_row_offset + i // n)
  np.testing.assert_allclose(
      embedding.embedding_tables["t"].numpy()[rows, :4], want)
  with pytest.raises(ValueError, match="Table 't': only TPUEmbeddingV2"):
    tfemb.TPUEmbedding(feature, optimizer)


@pytest.mark.requires_tensorflow("2.17")
def test_another_releases_custom_combiner_looks_up_a_v2_table():
  """A `CustomCombiner` of another TensorFlow release's class object:
  tfemb's TableConfig takes it and TPUEmbeddingV2 runs it."""
  total = lambda valency, vectors: tf.reduce_sum(vectors, axis=0)
  combiner = _another_release("CustomCombiner")(total, max_valency=2)
  table = tfemb.TableConfig(8, 4, initializer=tf.ones_initializer(),
                            name="t", combiner=combiner)
  embedding = tfemb.TPUEmbeddingV2(
      {"f": tfemb.FeatureConfig(table, output_shape=[2])}, tfemb.SGD(0.1))
  activations, _ = embedding({"f": tf.ragged.constant([[1, 2], [3]])})
  np.testing.assert_allclose(activations["f"].numpy(),
                             [[2.0] * 4, [1.0] * 4])  # the rows' sums


def test_slot_dims_refused_by_a_tensorflow_without_them(monkeypatch):
  """A TensorFlow (2.18 to 2.20) whose CustomOptimizer has no slot_dims:
  converting one with slot_dims raises; without them, converts."""

  class CustomOptimizer:  # 2.18's arguments

    def __init__(self, custom_computation, learning_rate=0.01,
                 slot_names=None, slot_initializers=None,
                 hyperparameters=None):
      self.args = (custom_computation, learning_rate, slot_names,
                   slot_initializers, hyperparameters)

  monkeypatch.setattr(tf_embedding, "CustomOptimizer", CustomOptimizer,
                      raising=False)
  assert tf_versions.newest_class("CustomOptimizer") is None
  converted = tf_conversion.to_tensorflow(_backport_optimizer())
  assert type(converted) is CustomOptimizer
  assert converted.args[1:3] == (0.3, ["v"])
  with pytest.raises(tf_versions.TensorFlowVersionError,
                     match=r"\(slot_dims=\[2\]\) needs "
                     "CustomOptimizer.slot_dims, which TensorFlow has from "
                     "version 2.21"):
    tf_conversion.to_tensorflow(_backport_optimizer(slot_dims=[2]))


def test_tfembs_sparsecore_classes_are_tensorflows_where_it_has_them():
  for name in ("CustomOptimizer", "CustomCombiner",
               "SparseCoreEmbeddingConfig"):
    theirs = tf_versions.newest_class(name)
    ours = getattr(tfemb, name)
    assert ours is (theirs or getattr(sparsecore_backports, name)), name
    assert (theirs is not None) == _has(
        max(tf_versions.ADDED_IN[k] for k in tf_versions.ADDED_IN
            if k.split(".")[0] == name))


def test_the_tpu_engine_v2_gets_a_sparsecore_config_where_it_takes_one(
    monkeypatch):
  use_strategy(monkeypatch, StandInTPUStrategy(EmbeddingFeature.V2))
  table = tfemb.TableConfig(vocabulary_size=64, dim=8, name="t")
  feature_config = {"f": tfemb.FeatureConfig(table, output_shape=[16])}
  config = tfemb.SparseCoreEmbeddingConfig(max_ids_per_chip_per_sample=8)
  if not _has("2.17"):
    with pytest.raises(tf_versions.TensorFlowVersionError,
                       match="needs SparseCoreEmbeddingConfig, which "
                       "TensorFlow has from version 2.17"):
      delegate.make_tpu_embedding_v2(feature_config, tfemb.SGD(0.1),
                                     sparse_core_embedding_config=config)
    # Without one, TensorFlow's engine is built on every version.
    engine = delegate.make_tpu_embedding_v2(feature_config, tfemb.SGD(0.1))
    assert type(engine) is tf_embedding.TPUEmbeddingV2
    return
  engine = delegate.make_tpu_embedding_v2(feature_config, tfemb.SGD(0.1),
                                          sparse_core_embedding_config=config)
  assert type(engine) is tf_embedding.TPUEmbeddingV2
  handed = engine._sparse_core_embedding_config
  assert type(handed) is tf_embedding.SparseCoreEmbeddingConfig
  assert handed.max_ids_per_chip_per_sample == 8


def test_an_old_keras_3_is_refused_by_the_layer(monkeypatch):
  """Keras 3 before KERAS_MIN trains to wrong numbers under
  MirroredStrategy: the layer refuses it, naming the version needed.
  (tf_keras is TensorFlow's own; the check does not apply.)"""
  table = tfemb.TableConfig(vocabulary_size=10, dim=2, name="t")
  feature_config = {"f": tfemb.FeatureConfig(table)}
  if not keras_versions.keras_3():
    monkeypatch.setattr(keras_versions, "KERAS_MIN", "99.0.0")
    tfemb.layers.TPUEmbedding(feature_config, "sgd")
    return
  import keras  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(keras, "__version__", "3.3.3")
  with pytest.raises(RuntimeError, match=(
      f"needs Keras {keras_versions.KERAS_MIN} or newer; the installed Keras "
      r"is 3.3.3. Run `pip install 'keras>=")):
    tfemb.layers.TPUEmbedding(feature_config, "sgd")
  monkeypatch.setattr(keras, "__version__", keras_versions.KERAS_MIN)
  tfemb.layers.TPUEmbedding(feature_config, "sgd")


@pytest.mark.parametrize("kwargs", [
    dict(slot_names=["a", "b"], slot_initializers=[tf.zeros_initializer()]),
    dict(slot_names=["a"], slot_initializers=[tf.zeros_initializer()],
         slot_dims=[1, 2]),
    dict(slot_names=["a"], slot_initializers=[tf.zeros_initializer()],
         slot_dims=[3]),
], ids=["names", "dims_count", "dim_value"])
def test_the_backported_custom_optimizer_checks_as_2_21(kwargs):
  """Its errors are 2.21's (compared where the installed TensorFlow has
  2.21's class; else with 2.21's messages)."""
  with pytest.raises(ValueError) as ours:
    sparsecore_backports.CustomOptimizer(helpers.sgd_computation, **kwargs)
  theirs = tf_versions.newest_class("CustomOptimizer")
  if theirs is not None:
    with pytest.raises(ValueError) as error:
      theirs(helpers.sgd_computation, **kwargs)
    assert str(ours.value) == str(error.value)
  assert "must match" in str(ours.value) or "Unsupported slot dim '3'" in str(
      ours.value)


def test_the_backported_custom_combiner_checks_as_2_21():
  with pytest.raises(ValueError, match="When `num_weights` is greater than "
                     "0, `initializer` must be set."):
    sparsecore_backports.CustomCombiner(helpers.sgd_computation, max_valency=4,
                                        num_weights=2)
  combiner = sparsecore_backports.CustomCombiner(
      helpers.sgd_computation, max_valency=4, num_weights=2,
      initializer=tf.zeros_initializer())
  assert combiner._slot_names() == ["custom_combiner_variables"]
  assert str(combiner) == f"custom_combiner_{hash(helpers.sgd_computation)}"


def test_tpu_embedding_v2_on_the_host_needs_tensorflows_stacker():
  """The host's SparseCore engine lays tables out with TensorFlow's own
  stacker (2.17 on); before, it refuses with the version error."""
  table = tfemb.TableConfig(vocabulary_size=16, dim=4, name="t")
  feature_config = {"f": tfemb.FeatureConfig(table, output_shape=[8])}
  assert tf_versions.STACKER_ADDED_IN == "2.17"
  if _has("2.17"):
    engine = tfemb.TPUEmbeddingV2(feature_config, tfemb.SGD(0.1))
    assert list(engine.embedding_layouts) == ["t"]
    return
  with pytest.raises(tf_versions.TensorFlowVersionError,
                     match=r"TPUEmbeddingV2 on the host needs SparseCore "
                     r"table stacking \(_pywrap_sparse_core_layout\), which "
                     r"TensorFlow has from version 2.17 on; the installed "
                     r"TensorFlow is 2\.16"):
    tfemb.TPUEmbeddingV2(feature_config, tfemb.SGD(0.1))
