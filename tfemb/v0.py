"""`tfemb.TPUEmbeddingV0`: the mid-level API for TPUs without embedding
hardware, where a Keras optimizer trains the tables.

TensorFlow's `TPUEmbeddingV0` is a differentiable lookup whose
`embedding_tables` (`tf.Variable`s) the model's Keras optimizer trains like
any other weight; the embedding optimizer only says which slots to create.
TensorFlow's class refuses to be created off a `TPUStrategy`. This one
follows the current strategy when it is constructed, as `tfemb.TPUEmbedding`
does:

* under a `TPUStrategy`, it returns TensorFlow's own `TPUEmbeddingV0`
  (`tfemb.tpu.delegate.make_tpu_embedding` with `UNSUPPORTED` embedding
  hardware, whatever the TPU has), built from the configs converted by
  `tfemb.to_tensorflow`;
* under any other strategy, this class: the host engine's direct lookup
  (`tfemb.host.HostEmbedding.embedding_lookup`, plain TensorFlow ops,
  differentiable with respect to the tables), with the variables and
  checkpoint keys of TensorFlow's engines.
"""

from typing import Any, Optional

import tensorflow as tf
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import input_dtypes
from tfemb import options
from tfemb.host import HostEmbedding
from tfemb.tpu import delegate

_no_autograph = tf.autograph.experimental.do_not_convert


def _tpu_engine(feature_config, optimizer):
  # TPUEmbeddingV0's own signature, so both paths take the same arguments.
  return delegate.make_tpu_embedding(
      feature_config, optimizer,
      embedding_feature=delegate.EmbeddingFeature.UNSUPPORTED)


@delegate.delegated_on_tpu(_tpu_engine,
                          delegate.EmbeddingFeature.UNSUPPORTED)
class TPUEmbeddingV0(HostEmbedding,
                     tf.tpu.experimental.embedding.TPUEmbeddingV0):
  """`tf.tpu.experimental.embedding.TPUEmbeddingV0`, on any strategy.

  ```python
  table = tfemb.TableConfig(vocabulary_size=1000, dim=8, name="items")
  embedding = tfemb.TPUEmbeddingV0(
      {"item": tfemb.FeatureConfig(table)}, tfemb.SGD(0.1))
  optimizer = tf.keras.optimizers.SGD(0.1)
  tables = list(embedding.embedding_tables.values())
  with tf.GradientTape() as tape:
    loss = ...  # of embedding({"item": ids})
  optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
  ```

  Args:
    feature_config: a nested structure of `FeatureConfig`s, tfemb's or
      TensorFlow's.
    optimizer: an embedding optimizer (tfemb's or TensorFlow's) whose slots
      are created beside the tables (TensorFlow's V0 does the same), or
      None. It applies no update: the Keras optimizer does.

  Created under a `TPUStrategy` scope, this returns TensorFlow's own
  `TPUEmbeddingV0` instead (see the module docstring).

  It is an instance of TensorFlow's class too, for code that asks.
  TensorFlow's `__init__` does not run: it refuses any strategy but a
  TPU's. `HostEmbedding.__init__` sets up the host engine instead, and
  every method a program calls is this class's own.
  """

  def __init__(self, feature_config: Any, optimizer: Optional[Any]):
    # The Keras optimizer updates the tables: plain variables, each table
    # and slot its own (no slots interleaved beside the parameters).
    with options.use(interleaved_slots=False):
      super().__init__(feature_config, optimizer)

  @_no_autograph
  def embedding_lookup(self, features: Any, weights: Optional[Any] = None):
    """Looks up every feature of `feature_config` (TensorFlow's V0 takes the
    whole structure), differentiably with respect to `embedding_tables`.
    Each input is a Tensor, SparseTensor or RaggedTensor (not a numpy
    array or a list), as TensorFlow's V0 requires."""
    nest.assert_same_structure(features, self._feature_config)
    for (path, _), x in zip(
        nest.flatten_with_joined_string_paths(self._feature_config),
        nest.flatten(features)):
      if not isinstance(x, (tf.Tensor, tf.SparseTensor, tf.RaggedTensor)):
        raise ValueError(f"Input {path} is type {type(x)}. Tensor, "
                         "SparseTensor or RaggedTensor expected.")
    return self.direct_lookup(features, weights, input_dtypes.V0)
