"""The Keras layer's engines: the host engine, or TensorFlow's on a TPU.

The layer talks to its engine through one small adapter per path, so its own
code is the same everywhere. `EngineAdapter` declares what every adapter
gives the layer; the layer uses nothing else.

| path | adapter | engine |
|---|---|---|
| any non-TPU strategy | `HostEngine` | `tfemb.TPUEmbedding` (the host engine) |
| TPU, embedding hardware `V1` | `TPUEngineV1` | `tf.tpu.experimental.embedding.TPUEmbedding` |
| TPU, SparseCore (`V2`) | `TPUEngineV2` | `TPUEmbeddingV2` |
| TPU, `UNSUPPORTED` | `TPUEngineV0` | `TPUEmbeddingV0` |
| off the TPU, asked for V2 | `HostEngineV2` | `tfemb.TPUEmbeddingV2` (the SparseCore's numbers on the host) |

The TPU adapters follow tensorflow-recommenders' layer call for call
(`_tpu_embedding_lookup`, `build`, `embedding_tables`). Every path that
trains in the backward pass does so through one gradient trap
(`tfemb.layers.gradient_trap`).
"""

import abc
from typing import Dict, List

import tensorflow as tf
from tensorflow.python.saved_model import save_context  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import mid_level
from tfemb import resolution
from tfemb.serving import export
from tfemb.sparsecore import engine as sparsecore_engine
from tfemb import tf_conversion
from tfemb import tf_internals
from tfemb.layers import gradient_trap
from tfemb.tpu import delegate

EmbeddingFeature = delegate.EmbeddingFeature


def make_engine(on_tpu, feature_config, optimizer, table_config_map,
                strategy, pipeline_execution_with_tensor_core=False,
                embedding_feature=None, sparse_core_embedding_config=None):
  """The adapter for `strategy`: a host engine unless `on_tpu`.

  Args:
    on_tpu: the layer's `tfemb.tpu.delegate.on_tpu(strategy)`.
    feature_config: the layer's resolved `FeatureConfig`s (named tables
      with their optimizers: `tfemb.resolution`).
    optimizer: the layer's embedding optimizer (or None).
    table_config_map: `[(user TableConfig, layer's TableConfig)]`.
    strategy: the strategy the layer is created under.
    pipeline_execution_with_tensor_core: passed to the engine.
    embedding_feature: None (the TPU's) or the feature to use on a TPU.
    sparse_core_embedding_config: for `TPUEmbeddingV2`.
  """
  if not on_tpu:
    if (embedding_feature == EmbeddingFeature.V2 or
        sparse_core_embedding_config is not None):
      return HostEngineV2(feature_config, optimizer, table_config_map,
                          strategy, pipeline_execution_with_tensor_core,
                          embedding_feature, sparse_core_embedding_config)
    return HostEngine(feature_config, optimizer, table_config_map,
                      pipeline_execution_with_tensor_core, embedding_feature)
  feature = delegate.resolve_embedding_feature(strategy, embedding_feature)
  adapter = {EmbeddingFeature.V1: TPUEngineV1,
             EmbeddingFeature.V2: TPUEngineV2,
             EmbeddingFeature.UNSUPPORTED: TPUEngineV0}[feature]
  return adapter(feature_config, optimizer, table_config_map, strategy,
                 pipeline_execution_with_tensor_core, feature,
                 sparse_core_embedding_config)


def _slots_in_order(slots: Dict[str, tf.Variable]) -> List[tf.Variable]:
  """One table's variables: parameters first, then the slots by name."""
  return [slots["parameters"]] + [
      slots[n] for n in sorted(slots) if n != "parameters"]


class EngineAdapter(abc.ABC):
  """All the layer asks of an engine, on every path.

  Attributes:
    engine: the object the layer saves as `_tpu_embedding` (the same
      checkpoint attribute on every path).
    embedding_feature: the TPU's (as resolved) or, off TPU, the argument.
    trains_in_backward: True if the embedding optimizer updates the tables
      when a gradient reaches the layer's gradient trap; False where the
      model's Keras optimizer trains them (`trainable_tables()`).
    serving_fallback: True where inputs the TPU refuses but TensorFlow's
      serving class takes follow that class (`tfemb.inputs.serving_only`),
      as in tfrs' layer off the TPU.
  """

  trains_in_backward = True
  serving_fallback = False

  def __init__(self, feature_config, table_config_map, embedding_feature,
               engine):
    self.embedding_feature = embedding_feature
    self.engine = engine
    self._feature_config = feature_config
    self._table_config_map = table_config_map

  @abc.abstractmethod
  def build(self, input_shape, batch_size):
    """Creates the tables."""

  @abc.abstractmethod
  def lookup(self, features, weights, dummy, training):
    """The activations, with the training path through `dummy`, the trap
    weight (`tfemb.layers.gradient_trap`)."""

  @abc.abstractmethod
  def serving_tables(self):
    """The tables by the layer's `TableConfig`s, for
    `serving_embedding_lookup`."""

  def embedding_tables(self):
    """The tables by the user's `TableConfig`s."""
    tables = self.serving_tables()
    return {user: tables[ours] for user, ours in self._table_config_map}

  @abc.abstractmethod
  def embedding_variables(self):
    """Tables and slots by the user's `TableConfig`s."""

  def saved_variables(self):
    """Every table and slot, in the order of Keras 3 saving."""
    return [v for slots in self.embedding_variables().values()
            for v in _slots_in_order(slots)]

  def trainable_tables(self):
    """The tables the model's Keras optimizer trains: none where the
    embedding optimizer does (`trains_in_backward`)."""
    return []

  def pull(self):
    """Before the variables' values are read: nothing where the variables
    hold them."""

  def push(self):
    """After the variables' values are written: nothing where the variables
    hold them."""


class _HostAdapter(EngineAdapter):
  """Off the TPU: tfemb's engines, which look up outside the trap and train
  through it; no gradient path in inference and SavedModels."""

  serving_fallback = True  # inputs.serving_only: the serving class's rules

  @abc.abstractmethod
  def _forward(self, features, weights):
    """The activations and the function that applies their gradients."""

  def lookup(self, features, weights, dummy, training):
    if export.saving():  # traced for a SavedModel: no training engine
      return export.serving_activations(self.engine, features, weights)
    activations, apply_gradients = self._forward(features, weights)
    if training is False or save_context.in_save_context():
      return activations
    return gradient_trap.trap(
        self._feature_config, dummy,
        lambda *flat: ([tf.identity(x) for x in flat], apply_gradients),
        *tf.nest.flatten(activations))


class HostEngine(_HostAdapter):
  """CPU/GPU: the host engine's `forward()`, trained through the trap."""

  def __init__(self, feature_config, optimizer, table_config_map,
               pipeline_execution_with_tensor_core, embedding_feature):
    super().__init__(  # embedding_feature: kept, unused off TPU
        feature_config, table_config_map, embedding_feature,
        mid_level.TPUEmbedding(feature_config, optimizer,
                               pipeline_execution_with_tensor_core))

  def build(self, input_shape, batch_size):
    del input_shape  # Output shapes come from the first batch.
    if batch_size is None:
      self.engine.build()
    else:
      self.engine.build(per_replica_batch_size=batch_size)

  def _forward(self, features, weights):
    # As tfrs' layer off the TPU: any batch size. Only `batch_size` or a
    # FeatureConfig's `output_shape` fix the activation shapes, never a
    # call (a fit with one batch size, then a predict with another).
    # As tfrs' layer off the TPU, which looks up with TensorFlow's serving
    # class: what only that class takes (a scalar id, a rank-1 SparseTensor)
    # gets its shapes; the rest, the TPU's.
    return self.engine.forward(
        features, weights, serving_fallback=True, call_shapes_only=True)

  def serving_tables(self):
    return self.engine.embedding_tables

  def embedding_variables(self):
    variables = self.engine.variables
    return {user: variables[ours] for user, ours in self._table_config_map}


class _TPUEngine(EngineAdapter):
  """Common to TensorFlow's three engines: the configs handed over, and the
  tables, which TensorFlow keys by table name."""

  def __init__(self, feature_config, optimizer, table_config_map, strategy,
               pipeline_execution_with_tensor_core, embedding_feature,
               sparse_core_embedding_config):
    tf_features = tf_conversion.to_tensorflow(feature_config)
    self._check_features(tf_features)
    super().__init__(
        feature_config, table_config_map, embedding_feature,
        delegate.make_tpu_embedding(
            tf_features, optimizer, pipeline_execution_with_tensor_core,
            strategy=strategy, embedding_feature=embedding_feature,
            sparse_core_embedding_config=sparse_core_embedding_config))
    self._learning_rates = resolution.counting_learning_rates(
        [ours for _, ours in table_config_map])

  def _check_features(self, tf_features):
    pass

  def _count_step(self):
    """After `apply_gradients`: Keras-translated learning rates count the
    step, as the host engine does after its update."""
    for lr in self._learning_rates:
      lr.advance()

  def serving_tables(self):
    tables = {t.name: v for t, v in self.engine.embedding_tables.items()}
    return {ours: tables[ours.name] for _, ours in self._table_config_map}

  def embedding_variables(self):
    if not tf_internals.tpu_engine_built(self.engine):
      raise RuntimeError(
          "The TPU embedding tables do not exist yet: TensorFlow's engine "
          "creates them when the layer is built (its first call).")
    variables = tf_internals.tpu_engine_variables(self.engine)
    return {user: dict(variables[ours.name])
            for user, ours in self._table_config_map}


class TPUEngineV1(_TPUEngine):
  """`TPUEmbedding` (embedding hardware): enqueue, dequeue, apply_gradients,
  tied together by a call id, as tensorflow-recommenders does."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._call_id = 0

  def build(self, input_shape, batch_size):
    if batch_size is None:
      # One TensorShape per feature (Keras 3 gives tuples, which TensorFlow
      # would flatten into their dimensions).
      shapes = nest.map_structure_up_to(self._feature_config, tf.TensorShape,
                                        input_shape)
      self.engine.build(per_replica_input_shapes=shapes)
    else:
      self.engine.build(per_replica_batch_size=batch_size)

  def lookup(self, features, weights, dummy, training):
    del training  # TensorFlow's graph pass decides, from the gradients.
    # One id per call tags the ops of this call for TensorFlow's graph pass.
    self._call_id += 1
    name = str(self._call_id)
    self.engine.enqueue(features, weights, training=True, name=name)

    def dequeue():
      def apply_gradients(gradients, loss_scaled):
        del loss_scaled  # TensorFlow's engine applies what it is given
        self.engine.apply_gradients(gradients, name=name)
        self._count_step()
      return self.engine.dequeue(name=name), apply_gradients

    return gradient_trap.trap(self._feature_config, dummy, dequeue)

  def pull(self):
    """The TPU's values into the variables (as TensorFlow's checkpoint
    saver does before it reads them)."""
    tf_internals.retrieve_from_tpu(self.engine)

  def push(self):
    """The variables' values onto the TPU (as TensorFlow's restore does)."""
    tf_internals.load_onto_tpu(self.engine)


class _StackedTables(EngineAdapter):
  """The SparseCore's tables, on the TPU or the host: built from the
  FeatureConfigs' output shapes, stacked, and keyed by the stacked table
  names, as tensorflow-recommenders returns them; checkpoints have
  TensorFlow's stacked layout."""

  def _check_features(self, features):
    for path, feature in nest.flatten_with_joined_string_paths(features):
      shape = feature.output_shape
      if not shape or any(d is None for d in tf.TensorShape(shape).as_list()):
        raise ValueError(
            f"Feature {path!r}: TPUEmbeddingV2 (SparseCore) needs a fully "
            "defined per-replica output_shape in its FeatureConfig at "
            f"construction (e.g. output_shape=[batch_size]), got {shape}.")

  def build(self, input_shape, batch_size):
    del input_shape, batch_size  # Shapes come from the FeatureConfigs.
    self.engine.build()

  def serving_tables(self):
    return self.engine.embedding_tables

  def embedding_tables(self):
    return self.engine.embedding_tables

  def embedding_variables(self):
    return self.engine.variables


class TPUEngineV2(_StackedTables, _TPUEngine):
  """`TPUEmbeddingV2` (SparseCore): one call looks up, the preserved outputs
  go back with the gradients."""

  def lookup(self, features, weights, dummy, training):
    del training

    def look_up():
      activations, preserved = self.engine(features, weights)

      def apply_gradients(gradients, loss_scaled):
        del loss_scaled  # TensorFlow's engine applies what it is given
        self.engine.apply_gradients(gradients, preserved_outputs=preserved)
        self._count_step()

      return activations, apply_gradients

    return gradient_trap.trap(self._feature_config, dummy, look_up)


class TPUEngineV0(_TPUEngine):
  """`TPUEmbeddingV0` (no embedding hardware): a plain lookup; the tables are
  trainable variables of the layer, updated by the model's Keras optimizer.

  TensorFlow's V0 applies no embedding optimizer, so the embedding
  optimizer's numbers (docs/numerics.md) do not hold here.
  """

  trains_in_backward = False

  def build(self, input_shape, batch_size):
    del input_shape, batch_size
    self.engine.build()

  def trainable_tables(self):
    return list(self.engine.embedding_tables.values())

  def lookup(self, features, weights, dummy, training):
    del dummy, training
    return self.engine(features, weights)


class HostEngineV2(_StackedTables, _HostAdapter):
  """Off the TPU, the SparseCore's numbers (`tfemb.TPUEmbeddingV2` on the
  host), when the layer is given a `sparse_core_embedding_config` or
  `embedding_feature=V2`: trained through the gradient trap as on a
  SparseCore, tables stacked and keyed as there."""

  serving_fallback = False  # the SparseCore's input rules

  def __init__(self, feature_config, optimizer, table_config_map, strategy,
               pipeline_execution_with_tensor_core, embedding_feature,
               sparse_core_embedding_config):
    del strategy
    self._check_features(feature_config)
    super().__init__(
        feature_config, table_config_map, embedding_feature,
        sparsecore_engine.TPUEmbeddingV2(
            feature_config, optimizer, pipeline_execution_with_tensor_core,
            sparse_core_embedding_config))

  def _forward(self, features, weights):
    # The host's update steps the Keras-translated learning rates itself.
    activations, preserved = self.engine(features, weights)
    return activations, (
        lambda grads, loss_scaled: self.engine.apply_loss_scaled_gradients(
            grads, preserved, loss_scaled))
