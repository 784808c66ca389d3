"""The embedding part of a tfemb step alone, as `tfemb_engine` measures it,
through `tfemb.TPUEmbeddingV2` (the SparseCore generation on the host):
`embedding(features)` then `apply_gradients(gradients, preserved)`, on the
workload's tables stacked as TensorFlow stacks them."""

import tensorflow as tf
import tfemb

from benchmarks.stacks import tfemb_common

STEPS_PER_CALL = 8


def build(workload):
  features = {
      n: tfemb.FeatureConfig(feature.table, output_shape=[workload.batch],
                             name=n)
      for n, feature in tfemb_common.feature_config(workload).items()}
  embedding = tfemb.TPUEmbeddingV2(features, tfemb_common.optimizer(workload))
  constants = tfemb_common.fixed_batches(workload, STEPS_PER_CALL)

  @tf.function
  def steps(features, labels):
    del features, labels  # the workload's batches, all of them, instead
    total = tf.constant(0.0)
    for batch, gradients in constants:
      activations, preserved = embedding(batch)
      embedding.apply_gradients(gradients, preserved)
      total += activations[workload.names[0]][0, 0]
    return total

  return steps
