"""On a TPU: TensorFlow's engines, called as tensorflow-recommenders'
layer calls them; TensorFlow keys their tables by table name. Under a host
TPUStrategy (`tfemb.patch(tpu=TYPE)`) the same calls reach tfemb's host
engine of the type's generation (`tfemb.tpu.delegate`)."""

import tensorflow as tf
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import resolution
from tfemb import tf_conversion
from tfemb import tf_internals
from tfemb.host import core
from tfemb.layers import gradient_trap
from tfemb.layers.adapters import stacked
from tfemb.layers.adapters.base import EngineAdapter
from tfemb.tpu import delegate


class TPUAdapter(EngineAdapter):
  """Common to TensorFlow's three engines: the configs handed over, the
  step the Keras-translated learning rates count, and the tables by
  name."""

  def __init__(self, config, optimizer, strategy,
               pipeline_execution_with_tensor_core, embedding_feature,
               sparse_core_embedding_config):
    tf_features = tf_conversion.to_tensorflow(config.structure)
    super().__init__(
        config, embedding_feature,
        delegate.make_tpu_embedding(
            tf_features, optimizer, pipeline_execution_with_tensor_core,
            strategy=strategy, embedding_feature=embedding_feature,
            sparse_core_embedding_config=sparse_core_embedding_config))
    # Under a host TPUStrategy the engine is tfemb's, which counts its
    # steps itself (`tfemb.host.step`); TensorFlow's does not.
    self._learning_rates = ([] if isinstance(self.engine, core.Engine) else
                            resolution.counting_learning_rates(config.tables))

  def _count_step(self):
    """After `apply_gradients`: Keras-translated learning rates count the
    step, as the host engine does after its update."""
    for lr in self._learning_rates:
      lr.advance()

  def serving_tables(self):
    tables = {t.name: v for t, v in self.engine.embedding_tables.items()}
    return {ours: tables[ours.name] for ours in self._config.tables}

  def embedding_variables(self):
    if not tf_internals.tpu_engine_built(self.engine):
      raise RuntimeError(
          "The TPU embedding tables do not exist yet: TensorFlow's engine "
          "creates them when the layer is built (its first call).")
    variables = tf_internals.tpu_engine_variables(self.engine)
    return {user: dict(variables[ours.name])
            for user, ours in self._config.user_pairs()}


class TPUV1Adapter(TPUAdapter):
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


class TPUV2Adapter(stacked.StackedTables, TPUAdapter):
  """`TPUEmbeddingV2` (SparseCore): one call looks up, the preserved outputs
  go back with the gradients."""

  def __init__(self, config, *args, **kwargs):
    stacked.check_output_shapes(config.structure)
    super().__init__(config, *args, **kwargs)

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


class TPUV0Adapter(TPUAdapter):
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
