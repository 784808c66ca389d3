"""tfemb's Keras layer following the SparseCore (`TPUEmbeddingV2`'s tables
stacked as TensorFlow stacks them, its numbers), as `tfemb_layer` measures
the first generation: the same model, head and train step."""

import tensorflow as tf
import tfemb.layers

from benchmarks import train_step
from benchmarks.stacks import tfemb_common


def build(workload, on_trace=None):
  keras = tf.keras
  features = {
      n: tfemb.FeatureConfig(feature.table, output_shape=[workload.batch],
                             name=n)
      for n, feature in tfemb_common.feature_config(workload).items()}
  # `embedding_feature=V2`, no SparseCoreEmbeddingConfig: the SparseCore's
  # numbers without counting its id limits (which a config turns on).
  layer = tfemb.layers.TPUEmbedding(
      features, tfemb_common.optimizer(workload),
      embedding_feature=(
          tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V2))
  inputs = train_step.keras_inputs(keras, workload)
  model = keras.Model(inputs, train_step.concat_head(keras, layer(inputs),
                                                     workload.names))
  optimizer = train_step.keras_optimizer(keras.optimizers, workload)
  return train_step.keras_train_step(model, optimizer, on_trace)
