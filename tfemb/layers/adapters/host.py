"""Off the TPU: tfemb's engines, which look up outside the gradient trap
and train through it; no gradient path in inference and SavedModels."""

from typing import Dict

import tensorflow as tf
from tensorflow.python.saved_model import save_context  # pylint: disable=g-direct-tensorflow-import

from tfemb import mid_level
from tfemb.host import engine as host_engine
from tfemb.layers import gradient_trap
from tfemb.layers.adapters import stacked
from tfemb.layers.adapters.base import EngineAdapter
from tfemb.serving import export
from tfemb.sparsecore import engine as sparsecore_engine


class HostAdapter(EngineAdapter):
  """CPU/GPU: the host engine's `forward()`, trained through the trap."""

  serving_fallback = True  # inputs.serving_only: the serving class's rules

  @classmethod
  def create(cls, config, pipeline_execution_with_tensor_core,
             embedding_feature):
    # The engine takes the layer's resolved configuration as it is (its
    # tables' optimizers included: no global optimizer to apply again).
    return cls(  # embedding_feature: kept, unused off TPU
        config, embedding_feature,
        mid_level.TPUEmbedding(config, None,
                               pipeline_execution_with_tensor_core))

  def build(self, input_shape, batch_size):
    del input_shape  # Output shapes come from the first batch.
    if batch_size is None:
      self.engine.build()
    else:
      self.engine.build(per_replica_batch_size=batch_size)

  def _forward(self, features, weights):
    """The activations and the function that applies their gradients."""
    # As tfrs' layer off the TPU: any batch size. Only `batch_size` or a
    # FeatureConfig's `output_shape` fix the activation shapes, never a
    # call (a fit with one batch size, then a predict with another).
    # As tfrs' layer off the TPU, which looks up with TensorFlow's serving
    # class: what only that class takes (a scalar id, a rank-1 SparseTensor)
    # gets its shapes; the rest, the TPU's.
    return self.engine.forward(features, weights, host_engine.KERAS_LAYER)

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

  def serving_tables(self):
    return self.engine.embedding_tables

  def embedding_variables(self):
    variables = self.engine.variables
    return {user: variables[ours] for user, ours in self._config.user_pairs()}

  @property
  def non_finite_gradients(self) -> str:
    return self.engine.non_finite_gradients

  @non_finite_gradients.setter
  def non_finite_gradients(self, policy: str):
    self.engine.non_finite_gradients = policy

  def skipped_steps(self) -> int:
    return self.engine.skipped_steps


class HostV2Adapter(stacked.StackedTables, HostAdapter):
  """Off the TPU, the SparseCore's numbers (`tfemb.TPUEmbeddingV2` on the
  host), when the layer is given a `sparse_core_embedding_config` or
  `embedding_feature=V2`: trained through the gradient trap as on a
  SparseCore, tables stacked and keyed as there."""

  serving_fallback = False  # the SparseCore's input rules

  @classmethod
  def create(cls, config, pipeline_execution_with_tensor_core,
             embedding_feature, sparse_core_embedding_config):
    stacked.check_output_shapes(config.structure)
    return cls(
        config, embedding_feature,
        sparsecore_engine.TPUEmbeddingV2(
            config, None, pipeline_execution_with_tensor_core,
            sparse_core_embedding_config))

  def dropped_ids(self) -> Dict[str, int]:
    return self.engine.dropped_ids

  def _forward(self, features, weights):
    # The host's update steps the Keras-translated learning rates itself.
    activations, preserved = self.engine(features, weights)
    return activations, (
        lambda grads, loss_scaled: self.engine.apply_loss_scaled_gradients(
            grads, preserved, loss_scaled))
