"""`tfemb.layers.TPUEmbedding`: the Keras layer, for Keras 3 and tf_keras.

The layer has `tfrs.layers.embedding.TPUEmbedding`'s constructor and call,
and the TPU path's training semantics on every device: the tables are
trained by the embedding optimizer inside the backward pass, never by the
model's Keras optimizer. As on a TPU, the layer's only trainable weight is a
one-element "gradient trap" (`tpu_embedding_helper_dummy`); the gradient that
reaches it carries the activation gradients to the engine, which updates the
touched rows. `evaluate` and `predict` compute no gradient and so never
change a table.

Created under a `TPUStrategy`, the layer hands its work to TensorFlow's TPU
engine as tensorflow-recommenders' layer does (see `tfemb.layers.adapters`):
`TPUEmbedding` (embedding hardware V1) and `TPUEmbeddingV2` (SparseCore) train
the tables with the embedding optimizer behind the same gradient trap;
`TPUEmbeddingV0` (no embedding hardware) applies no embedding optimizer: its
tables are trainable weights for the model's Keras optimizer, so on V0 the
embedding optimizer's numbers do not hold (and with Keras 3, whose `fit`
only takes Keras variables, train V0 tables in a custom loop).

The layer subclasses `tf.keras.layers.Layer`: Keras 3 by default, tf_keras
with `TF_USE_LEGACY_KERAS=1`.
"""

import copy
from typing import Any, Dict, Optional

import numpy as np
import tensorflow as tf

from tfemb import inputs
from tfemb import resolution
from tfemb import shapes
from tfemb.layers import adapters
from tfemb.layers import keras_optimizers
from tfemb.layers import keras_versions
from tfemb.layers import loss_scale
from tfemb.layers import serialization
from tfemb.serving import keras_export
from tfemb import tpu_strategies

_DUMMY_NAME = "tpu_embedding_helper_dummy"
_KERAS_3 = keras_versions.keras_3()
_OPTIMIZERS_BY_NAME = {
    "sgd": "SGD", "adagrad": "Adagrad", "adam": "Adam", "ftrl": "FTRL"
}
# Keras' `model.export` (its `ExportArchive`) writes the inference tables:
# the one hook by which tfemb recognises it (`tfemb.serving.keras_export`).
keras_export.install()
# Keras' loss scaling (mixed_float16) reaches the tables unscaled
# (`tfemb.layers.loss_scale`).
loss_scale.install()


def _placeholders_as_ids(features):
  """Keras 3 builds an unbuilt subclassed model by calling it on float32
  placeholders of the input shapes (`Model.build`); they carry shapes, not
  data, so they are read as ids, as Keras' own `Embedding` reads them. The
  first-generation and SparseCore engines cast float ids themselves, as
  TensorFlow's do (`tfemb.input_dtypes`); `TPUEmbeddingV0`, TensorFlow's
  too, casts nothing, and would refuse them."""
  return tf.nest.map_structure(
      lambda x: tf.cast(x, tf.int32) if x.dtype.is_floating else x, features)


def normalize_optimizer(optimizer):
  """An embedding optimizer from any form the layer accepts."""
  from tfemb import optimizers  # pylint: disable=g-import-not-at-top
  if optimizer is None:
    return None
  if isinstance(optimizer, str):
    if optimizer.lower() not in _OPTIMIZERS_BY_NAME:
      raise ValueError(
          f"Unknown optimizer name {optimizer!r}. Please use one of 'sgd', "
          "'adagrad', 'adam', or 'ftrl'.")
    return getattr(optimizers, _OPTIMIZERS_BY_NAME[optimizer.lower()])()
  if optimizers.is_optimizer(optimizer) or optimizers.is_custom(optimizer):
    return optimizer
  module = type(optimizer).__module__
  if module.startswith(("keras.", "tf_keras.")):
    return keras_optimizers.translate_keras_optimizer(optimizer)
  raise ValueError(
      f"Unknown optimizer type {type(optimizer)}. Please pass a string "
      "optimizer name, a Keras optimizer or an instance of one of tfemb's "
      "(or tf.tpu.experimental.embedding's) optimizer classes.")


def _with_table(feature, table):
  """A copy of `feature` that looks `table` up."""
  feature = copy.copy(feature)
  feature.table = table
  return feature


@tf.keras.utils.register_keras_serializable(package="tfemb")
class TPUEmbedding(tf.keras.layers.Layer):
  """Embedding lookups trained with the TPU embedding engine's numbers.

  A drop-in for `tfrs.layers.embedding.TPUEmbedding`:

  ```python
  embedding = tfemb.layers.TPUEmbedding(feature_config, tfemb.Adagrad(0.1))
  activations = embedding(features)  # same structure as feature_config
  ```

  Args:
    feature_config: a nested structure of `FeatureConfig`s (tfemb's or
      `tf.tpu.experimental.embedding`'s). The layer works on copies.
    optimizer: the optimizer of tables without their own: a tfemb or
      `tf.tpu.experimental.embedding` optimizer, a Keras SGD/Adagrad/Adam/
      Ftrl (see `translate_keras_optimizer`), a name ('sgd', 'adagrad',
      'adam', 'ftrl') or None (lookups only).
    pipeline_execution_with_tensor_core: TPU scheduling hint; no effect on
      the host.
    batch_size: fixes the per-replica batch size (deprecated in tfrs).
    embedding_feature: which TPU embedding hardware to use: None (the
      TPU's) or `UNSUPPORTED` (`TPUEmbeddingV0`). Off the TPU, `V2` trains
      with the SparseCore's numbers (`tfemb.TPUEmbeddingV2` on the host,
      docs/sparsecore.md); anything else, with the first generation's.
    sparse_core_embedding_config: SparseCore settings. Given off the TPU,
      the layer also follows the SparseCore (as with `embedding_feature=V2`).
    **kwargs: Keras layer arguments (e.g. `name`).

  On a TPU the engine needs fully defined per-replica output shapes: with
  embedding hardware (V1), from `batch_size`, the inputs' static shapes or
  `FeatureConfig.output_shape`; with SparseCore (V2), every `FeatureConfig`
  must give `output_shape`. Create and call the layer under the same kind of
  strategy (TPU or not).
  """

  def __init__(self,
               feature_config: Any,
               optimizer: Any,
               pipeline_execution_with_tensor_core: bool = False,
               batch_size: Optional[int] = None,
               embedding_feature: Any = None,
               sparse_core_embedding_config: Any = None,
               **kwargs):
    keras_versions.check_keras()
    super().__init__(**kwargs)
    self._optimizer = normalize_optimizer(optimizer)
    # Copies, named and with their optimizers (`tfemb.resolution`): the
    # layer never changes the user's objects.
    # Resolved once: the host engines take this resolution as it is.
    self._config = resolution.resolve(feature_config, self._optimizer,
                                      normalize=normalize_optimizer)
    self._feature_config = self._config.structure
    self._creation_strategy = tf.distribute.get_strategy()
    # TPU branches: a TPU's strategy or a host one (`tfemb.tpu.delegate.on_tpu` says
    # which of the two does the work).
    self._tpu_branches = tpu_strategies.is_tpu_strategy(
        self._creation_strategy)
    self._sparse_core_embedding_config = sparse_core_embedding_config
    self._pipeline_execution_with_tensor_core = (
        pipeline_execution_with_tensor_core)
    self._engine = adapters.make_adapter(
        self._tpu_branches, self._config, self._optimizer, self._creation_strategy, pipeline_execution_with_tensor_core,
        embedding_feature, sparse_core_embedding_config)
    self._embedding_feature = self._engine.embedding_feature
    self._tpu_embedding = self._engine.engine  # the checkpointed engine
    self.batch_size = batch_size
    self.supports_jit = False  # tf.unique and sparse updates: no XLA

  @property
  def _table_config_map(self):
    """`[(user's TableConfig, the layer's copy)]`, as tfrs' layer keeps."""
    return self._config.user_pairs()

  def build(self, input_shape=None):
    self._engine.build(input_shape, self.batch_size)
    if self._engine.trains_in_backward:
      setattr(self, _DUMMY_NAME, self.add_weight(
          name=_DUMMY_NAME, shape=(1,), initializer="zeros", trainable=True,
          dtype="float32"))
    else:  # TPUEmbeddingV0: the model's Keras optimizer trains the tables.
      tables = self._engine.trainable_tables()
      setattr(self, _DUMMY_NAME, tables)
      if _KERAS_3:  # Keras 3 tracks only its own Variables by assignment.
        for table in tables:
          self._track_variable(table)
    self._bind_learning_rates()
    self.built = True

  def _bind_learning_rates(self):
    """Keras-translated learning rates count steps in a layer weight, so the
    step (schedules, Adam's bias correction) is saved with the model."""
    rates = resolution.counting_learning_rates(self._config.tables)
    if rates:
      self.embedding_iterations = self.add_weight(
          name="embedding_iterations", shape=(), initializer="zeros",
          trainable=False, dtype="int64")
      for lr in rates:
        lr.bind(self.embedding_iterations)

  def call(self, features, weights=None, serving_config=None, training=None):
    """Looks `features` up; trains the tables when a gradient flows back.

    Args:
      features: a nested structure of `Tensor`s, `SparseTensor`s or
        `RaggedTensor`s with the structure of `feature_config`.
      weights: None, or per-id weights with the structure of `features`.
      serving_config: if given, a nested structure of `FeatureConfig`s (over
        the tables given to the layer) for a plain CPU lookup, as TensorFlow's
        `serving_embedding_lookup` does.
      training: Keras' flag. With `training=False` (predict, evaluate,
        exported serving functions) the lookup has no gradient path. (On a
        TPU, as in tfrs, TensorFlow decides from the gradients.)
    """
    if serving_config is not None:
      serving_config = self._map_tables(serving_config)
      return tf.tpu.experimental.embedding.serving_embedding_lookup(
          features, weights, self._engine.serving_tables(), serving_config)
    self._check_strategy()
    if keras_versions.in_keras_symbolic_scope():
      features = _placeholders_as_ids(features)
    return self._engine.lookup(features, weights, getattr(self, _DUMMY_NAME),
                               training)

  def _check_strategy(self):
    """As tfrs: created and called under the same kind of strategy."""
    created = self._creation_strategy
    current = tf.distribute.get_strategy()
    if tpu_strategies.is_tpu_strategy(current) == self._tpu_branches:
      return
    if not self._tpu_branches:
      raise RuntimeError(
          f"Layer {self.name!r} was created under strategy {created} but is "
          f"being called under a TPUStrategy ({current}). Please create the "
          "layer under a TPUStrategy if you wish to run the layer on TPU.")
    raise RuntimeError(
        f"Layer {self.name!r} was created under strategy {created} (a "
        f"TPUStrategy) but is being called under strategy {current}. Please "
        "use strategy.run when calling this layer.")

  def compute_output_spec(self, features, weights=None, serving_config=None,
                          training=None):
    """Keras 3's symbolic pass: the activation shapes, without tracing.

    (Keras 3 traces a layer with dense placeholders even for ragged inputs.)
    """
    del weights, training
    if serving_config is not None:
      return super().compute_output_spec(features, serving_config=serving_config)
    specs = []
    for x, feature in zip(tf.nest.flatten(features),
                          tf.nest.flatten(self._feature_config)):
      kind = ("ragged" if getattr(x, "ragged", False) else
              "sparse" if getattr(x, "sparse", False) else "dense")
      shape = tf.TensorShape(x.shape)
      serving = (self._engine.serving_fallback and
                 inputs.serving_only(shape, kind))
      shape = shapes.from_lookup_input(shape, kind, feature, serving)
      specs.append(tf.keras.KerasTensor(
          shape.concatenate([feature.table.dim]).as_list(), dtype="float32"))
    return tf.nest.pack_sequence_as(self._feature_config, specs)

  def _map_tables(self, serving_config):
    clones = []
    for feature in tf.nest.flatten(serving_config):
      try:
        ours = self._config.table_of(feature.table)
      except KeyError:
        raise ValueError(
            f"TableConfig {feature.table} does not match any of the "
            "TableConfigs used to configure this layer.") from None
      clones.append(_with_table(feature, ours))
    return tf.nest.pack_sequence_as(serving_config, clones)

  @property
  def embedding_tables(self) -> Dict[Any, tf.Variable]:
    """The tables, keyed by the `TableConfig`s given to the layer (with
    SparseCore, `TPUEmbeddingV2`'s stacked tables by name, as in tfrs)."""
    return self._engine.embedding_tables()

  @property
  def embedding_variables(self) -> Dict[Any, Dict[str, tf.Variable]]:
    """Tables and slots: `{TableConfig: {"parameters": .., slot: ..}}`."""
    return self._engine.embedding_variables()

  @property
  def dropped_ids(self) -> Dict[str, int]:
    """Following the SparseCore under a `SparseCoreEmbeddingConfig` with
    `allow_id_dropping`: the ids dropped so far, per stacked table
    (`tfemb.TPUEmbeddingV2.dropped_ids`); empty otherwise."""
    return dict(self._engine.dropped_ids())

  @property
  def non_finite_gradients(self) -> str:
    """"raise" (default) or "skip": see `tfemb.TPUEmbedding`'s property of
    the same name. On the host path only (a TPU applies what it gets)."""
    return self._engine.non_finite_gradients

  @non_finite_gradients.setter
  def non_finite_gradients(self, policy):
    self._engine.non_finite_gradients = policy

  @property
  def skipped_steps(self) -> int:
    """Steps skipped for non-finite gradients (policy "skip")."""
    return self._engine.skipped_steps()

  # --- saving ---------------------------------------------------------------

  def get_config(self):
    config = super().get_config()
    config.update(
        feature_config=serialization.feature_config_to_config(
            self._feature_config, global_optimizer=self._optimizer),
        optimizer=serialization.optimizer_to_config(self._optimizer,
                                                    "(the layer's optimizer)"),
        pipeline_execution_with_tensor_core=(
            self._pipeline_execution_with_tensor_core),
        batch_size=self.batch_size)
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    config["feature_config"] = serialization.feature_config_from_config(
        config["feature_config"])
    config["optimizer"] = serialization.optimizer_from_config(
        config["optimizer"])
    return cls(**config)

  def _all_saved_variables(self):
    """The layer's weights, then the tables and slots (by table, parameters
    first). On V0 the tables, also Keras weights, are listed once."""
    engine_vars = self._engine.saved_variables()
    keras_vars = [
        v for v in list(self.trainable_weights) +
        list(self.non_trainable_weights)
        if not any(v is e for e in engine_vars)]
    return keras_vars + engine_vars

  def save_own_variables(self, store):
    """Keras 3 `.keras` / `.weights.h5`: the layer's weights, then every
    table and slot (Keras does not see them as weights)."""
    self._engine.pull()
    for i, v in enumerate(self._all_saved_variables()):
      store[f"{i}"] = np.asarray(v.numpy())

  def load_own_variables(self, store):
    variables = self._all_saved_variables()
    if len(store.keys()) != len(variables):
      raise ValueError(
          f"Layer {self.name!r} expected {len(variables)} saved variables "
          f"(its weights, tables and slots), found {len(store.keys())}: the "
          "file was saved with a different configuration.")
    for i, v in enumerate(variables):
      v.assign(store[f"{i}"])
    self._engine.push()

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    # As tfrs: the gradient trap is not part of a checkpoint.
    children = super()._trackable_children(save_type, **kwargs)
    children.pop(_DUMMY_NAME, None)
    return children
