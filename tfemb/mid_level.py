"""`tfemb.TPUEmbedding`: the mid-level API users construct.

Which engine a construction gives depends on the current strategy
(`tf.distribute.get_strategy()`) at that moment:

* under a `TPUStrategy` (`tf.distribute.TPUStrategy` or
  `tf.distribute.experimental.TPUStrategy`), TensorFlow's own engine, from
  `tfemb.tpu.delegate.make_tpu_embedding`: the object returned *is*
  `tf.tpu.experimental.embedding.TPUEmbedding` (embedding hardware V1),
  `TPUEmbeddingV2` (SparseCore) or `TPUEmbeddingV0` (no embedding hardware),
  built from the configs converted by `tfemb.to_tensorflow`. It is not an
  instance of `tfemb.TPUEmbedding`, and its numbers are TensorFlow's;
* under any other strategy, this class: the host engine
  (`tfemb.host.HostEmbedding`, whose `forward` looks a batch up and returns
  the function that applies its gradients) with the TPU's `enqueue` /
  `dequeue` / `apply_gradients` protocol composed over it
  (`tfemb.host.tpu_protocol.TPUProtocol`).
"""

from typing import Any, Optional

import tensorflow as tf
from tensorflow.python.trackable import data_structures

from tfemb import shapes
from tfemb import tf_internals
from tfemb.host import HostEmbedding
from tfemb.host import tpu_protocol
from tfemb.tpu.planner import config_proto
from tfemb.tpu import delegate
from tfemb.tpu.host import tpu_rules

_no_autograph = tf.autograph.experimental.do_not_convert


def _tpu_engine(feature_config, optimizer,
                pipeline_execution_with_tensor_core=False):
  # TPUEmbedding's own signature, so both paths take the same arguments.
  return delegate.make_tpu_embedding(feature_config, optimizer,
                                     pipeline_execution_with_tensor_core)


@delegate.delegated_on_tpu(_tpu_engine,
                          delegate.EmbeddingFeature.V1)
class TPUEmbedding(HostEmbedding, tf.tpu.experimental.embedding.TPUEmbedding):
  """`tf.tpu.experimental.embedding.TPUEmbedding` with the TPU's numbers.

  ```python
  table = tfemb.TableConfig(vocabulary_size=1000, dim=8, name="items")
  embedding = tfemb.TPUEmbedding(
      {"item": tfemb.FeatureConfig(table=table)}, tfemb.Adagrad(0.1))
  embedding.enqueue({"item": ids}, training=True)
  with tf.GradientTape() as tape:
    activations = embedding.dequeue()
    tape.watch(activations)
    loss = ...
  embedding.apply_gradients(tape.gradient(loss, activations))
  ```

  Args: those of `tfemb.host.HostEmbedding`. Created under a `TPUStrategy`
  scope, this returns TensorFlow's own TPU engine instead (see the module
  docstring).

  It is an instance of TensorFlow's class too, for code that asks
  (keras-rs, TensorFlow's checkpoint callback, which calls its
  `_retrieve_variables` and `_load_variables`). TensorFlow's `__init__`
  does not run: it builds the TPU's configuration. `HostEmbedding.__init__`
  sets up the host engine instead, and every method a program calls is
  this class's own.
  """

  _create_copy_for_async_checkpoint = tf_internals.not_inherited()

  def _configure_tpu(self) -> None:
    """As the tables are created under a host TPUStrategy, the TPU's one
    embedding engine is configured for every output shape (a second engine
    refused until the TPU system is initialized again), as TensorFlow's
    `build` does on a TPU."""
    tpu_rules.check_build(self._core.strategy, self._core.config.paths,
                          self._core.output_shapes)

  def __init__(self, feature_config: Any, optimizer: Optional[Any],
               pipeline_execution_with_tensor_core: bool = False):
    super().__init__(feature_config, optimizer,
                     pipeline_execution_with_tensor_core)
    self._protocol = data_structures.NoDependency(
        tpu_protocol.TPUProtocol(self))

  @_no_autograph
  def enqueue(self, features, weights=None, training: bool = True,
              name: Optional[str] = None, device: Optional[str] = None):
    """Takes a batch of ids, as `TPUEmbedding.enqueue` on a TPU.

    Builds the object on first use (from the inputs' shapes), checks the
    inputs against the shapes fixed by then, and prepares the lookup. The
    next `dequeue` in the same function (or eagerly) returns its activations
    (with `device`, the next `dequeue` of the replica on that device).
    """
    del name
    tpu_rules.check_enqueue(self._core.strategy, features,
                            self._core.config.paths)
    self._protocol.enqueue(features, weights, training, device)

  @_no_autograph
  def dequeue(self, name: Optional[str] = None):
    """Returns the activations of the last `enqueue`, shaped like TF's.

    Under a multi-replica strategy, call it inside `strategy.run`: each
    replica gets the activations of its share of the enqueued batch.
    """
    del name
    return self._protocol.dequeue()

  @_no_autograph
  def apply_gradients(self, gradients, name: Optional[str] = None):
    """Updates the rows the last training batch touched.

    `gradients` has the structure of `feature_config`: the gradient of the
    loss with respect to each dequeued activation. A None gradient counts as
    zeros (as on the TPU: rows are still touched, which matters for Adam and
    weight decay).
    """
    del name
    self._protocol.apply_gradients(gradients)

  def _create_config_proto(self):
    """The `TPUEmbeddingConfiguration` TensorFlow's TPU engine would build
    for these configs and output shapes under the current strategy (one
    replica per device, one host per worker)."""
    config, output_shapes = self._core.config, self._core.output_shapes
    shapes.check_fully_defined(config.paths, output_shapes)
    extended = self._core.strategy.extended
    return config_proto.config_proto(
        config_proto.resolve(config.structure, None), output_shapes,
        num_replicas=self._core.strategy.num_replicas_in_sync,
        num_hosts=getattr(extended, "num_hosts", 1),
        pipeline_execution_with_tensor_core=(
            self._pipeline_execution_with_tensor_core))
