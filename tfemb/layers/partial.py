"""`tfemb.layers.PartialTPUEmbedding`: tensorflow-recommenders'
`PartialTPUEmbedding` (`tfrs.experimental.layers.embedding`), for Keras 3
and tf_keras (tfrs' needs tf_keras).

Tables of at most `size_threshold` rows become Keras `Embedding` layers,
trained by the model's optimizer like any other layer; the others go
through `tfemb.layers.TPUEmbedding`, trained by `optimizer` (a tfemb or a
Keras optimizer, as that layer takes). The attributes are tfrs' own
(`_keras_embedding_layers`, `_tpu_embedding`), so checkpoints hold the
tables under the names tfrs gives them.
"""

from typing import Any, Dict, Optional

import tensorflow as tf
from tensorflow.python.trackable import data_structures  # pylint: disable=g-direct-tensorflow-import

from tfemb import tf_internals
from tfemb.layers import embedding_layer
from tfemb.layers import serialization

# The constructor's arguments, as `get_config` writes them.
_ARGUMENTS = ("feature_config", "optimizer",
              "pipeline_execution_with_tensor_core", "batch_size",
              "size_threshold")


@tf.keras.utils.register_keras_serializable(package="tfemb")
class PartialTPUEmbedding(tf.keras.layers.Layer):
  """Keras `Embedding` layers for small tables, `TPUEmbedding` for the rest.

  Args:
    feature_config: a dict of `FeatureConfig`s (tfemb's or TensorFlow's),
      by feature name.
    optimizer: the optimizer of the tables above `size_threshold`.
    pipeline_execution_with_tensor_core: passed to `TPUEmbedding`.
    batch_size: passed to `TPUEmbedding`.
    size_threshold: tables with more rows than this go through
      `TPUEmbedding`; 0: every table does; None: none does.

  Called on a dict of inputs by feature name, returns a dict of activations
  by feature name. A feature of a Keras `Embedding` table takes a dense
  `tf.Tensor` of ids only, as in tfrs.
  """

  def __init__(self,
               feature_config: Dict[str, Any],
               optimizer: Any,
               pipeline_execution_with_tensor_core: bool = False,
               batch_size: Optional[int] = None,
               size_threshold: Optional[int] = 10_000) -> None:
    super().__init__()
    self._arguments = data_structures.NoDependency(dict(
        feature_config=feature_config,
        pipeline_execution_with_tensor_core=(
            pipeline_execution_with_tensor_core),
        batch_size=batch_size, size_threshold=size_threshold))
    tpu_features = {}
    keras_tables = {}
    self._keras_embedding_layers = {}
    for name, feature in feature_config.items():
      table = feature.table
      if size_threshold is not None and table.vocabulary_size > size_threshold:
        tpu_features[name] = feature
        continue
      if id(table) not in keras_tables:  # features may share a table
        keras_tables[id(table)] = tf.keras.layers.Embedding(
            input_dim=table.vocabulary_size, output_dim=table.dim,
            embeddings_initializer=table.initializer or "uniform")
      self._keras_embedding_layers[name] = keras_tables[id(table)]
    if tf.keras.layers.Layer.__module__.startswith("keras."):  # Keras 3
      # Keras 3 trains the layers of its own dict but does not make it a
      # checkpoint dependency: tfrs' name for it, as tf_keras gives it.
      self._track_trackable(
          data_structures.wrap_or_unwrap(dict(self._keras_embedding_layers)),
          "_keras_embedding_layers", overwrite=True)
    self._tpu_embedding = None
    if tpu_features:
      self._tpu_embedding = embedding_layer.TPUEmbedding(
          tpu_features, optimizer, pipeline_execution_with_tensor_core,
          batch_size)

  def build(self, input_shape=None):
    """Builds the Keras `Embedding` layers and the `TPUEmbedding` layer from
    the input shapes by feature name (Keras 3 calls this when it loads a
    saved model, before the weights are set)."""
    shapes = input_shape if isinstance(input_shape, dict) else {}
    for name, layer in self._keras_embedding_layers.items():
      if not layer.built:
        layer.build(shapes.get(name))
    if self._tpu_embedding is not None and not self._tpu_embedding.built:
      self._tpu_embedding.build(
          {k: v for k, v in shapes.items()
           if k not in self._keras_embedding_layers} or None)
    super().build(input_shape)

  def call(self, inputs: Dict[str, Any]) -> Dict[str, tf.Tensor]:
    output = {}
    for name, value in inputs.items():
      if name not in self._keras_embedding_layers:
        continue
      if isinstance(value, (tf.SparseTensor, tf.RaggedTensor)):
        raise ValueError(
            f"Feature {name!r}: only tf.Tensor input is supported for Keras "
            f"embedding layers, but got: {type(value)}")
      output[name] = self._keras_embedding_layers[name](value)
    if self._tpu_embedding is not None:
      output.update(self._tpu_embedding(
          {k: v for k, v in inputs.items()
           if k not in self._keras_embedding_layers}))
    return output

  def get_config(self):
    """The constructor's arguments (Keras 3 `model.save` needs them): every
    feature and table, so the same tables go to Keras `Embedding` layers
    when loaded; the optimizer as the `TPUEmbedding` layer translated it
    (None when no table goes through it)."""
    config = super().get_config()
    arguments = dict(self._arguments)
    optimizer = None
    if self._tpu_embedding is not None:
      optimizer = self._tpu_embedding.get_config()["optimizer"]
    config.update(
        arguments, optimizer=optimizer,
        feature_config=serialization.feature_config_to_config(
            arguments["feature_config"]))
    return config

  @classmethod
  def from_config(cls, config):
    arguments = {k: config[k] for k in _ARGUMENTS}
    arguments["feature_config"] = serialization.feature_config_from_config(
        arguments["feature_config"])
    arguments["optimizer"] = serialization.optimizer_from_config(
        arguments["optimizer"])
    layer = cls(**arguments)
    # The base layer's own: tfrs' constructor takes no name or trainable.
    layer.trainable = config.get("trainable", True)
    if "name" in config:
      try:
        layer.name = config["name"]
      except AttributeError:  # tf_keras: a read-only property
        tf_internals.set_layer_name(layer, config["name"])
    return layer

  @property
  def tpu_embedding(self) -> Optional[embedding_layer.TPUEmbedding]:
    """The `TPUEmbedding` layer, or None if only Keras embeddings are used."""
    return self._tpu_embedding

  @property
  def keras_embedding_layers(self) -> Dict[str, tf.keras.layers.Layer]:
    """The Keras `Embedding` layers, by feature name."""
    return self._keras_embedding_layers
