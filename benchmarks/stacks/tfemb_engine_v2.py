"""The embedding part of a tfemb step alone, as `tfemb_engine` measures it,
through `tfemb.TPUEmbeddingV2` (the SparseCore generation on the host):
`embedding(features)` then `apply_gradients(gradients, preserved)`, on the
workload's tables stacked as TensorFlow stacks them."""

import tfemb

from benchmarks.stacks import tfemb_common

STEPS_PER_CALL = tfemb_common.steps_per_call()


def build(workload):
  features = {
      n: tfemb.FeatureConfig(feature.table, output_shape=[workload.batch],
                             name=n)
      for n, feature in tfemb_common.feature_config(workload).items()}
  embedding = tfemb.TPUEmbeddingV2(features, tfemb_common.optimizer(workload))

  def one_step(batch, gradients):
    activations, preserved = embedding(batch)
    embedding.apply_gradients(gradients, preserved)
    return activations

  return tfemb_common.embedding_steps(workload, STEPS_PER_CALL, one_step)
