"""The embedding part of a tfemb step alone: mid-level `enqueue`,
`dequeue` and `apply_gradients` with a stand-in gradient (no model): fixed
per-batch tensors made once, so that no arithmetic outside the embedding
engine is counted.

This is the lookup + update time that the suite compares with the
memory-traffic bound (docs/performance.md, 'Method'); it is not a full training step and
is not compared with the peers. One call runs the workload's
`STEPS_PER_CALL` distinct batches one after another in one `tf.function`
(the child divides the time by it), so that Python's cost of calling a
function, the same for every stack and no part of a lookup or an update, is
not counted as embedding work.
"""

import tfemb

from benchmarks.stacks import tfemb_common

STEPS_PER_CALL = tfemb_common.steps_per_call()


def build(workload):
  embedding = tfemb.TPUEmbedding(tfemb_common.feature_config(workload),
                                 tfemb_common.optimizer(workload))

  def one_step(batch, gradients):
    embedding.enqueue(batch, training=True)
    activations = embedding.dequeue()
    embedding.apply_gradients(gradients)
    return activations

  return tfemb_common.embedding_steps(workload, STEPS_PER_CALL, one_step)
