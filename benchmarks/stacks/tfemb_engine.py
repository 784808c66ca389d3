"""The embedding part of a tfemb step alone: mid-level `enqueue`,
`dequeue` and `apply_gradients` with a cheap stand-in gradient (no model).

This is the lookup + update time that the suite compares with the
memory-traffic bound (issue 6 item 3); it is not a full training step and
is not compared with the peers. One call runs the workload's
`STEPS_PER_CALL` distinct batches one after another in one `tf.function`
(the child divides the time by it), so that Python's cost of calling a
function, the same for every stack and no part of a lookup or an update, is
not counted as embedding work.
"""

import tensorflow as tf
import tfemb

from benchmarks.stacks import tfemb_common

STEPS_PER_CALL = 8


def build(workload):
  embedding = tfemb.TPUEmbedding(tfemb_common.feature_config(workload),
                                 tfemb_common.optimizer(workload))
  batches = workload.make_batches()[:STEPS_PER_CALL]
  assert len(batches) == STEPS_PER_CALL, "fewer distinct batches than steps"
  constants = [({n: tf.constant(ids) for n, ids in features.items()},
                tf.constant(labels)) for features, labels in batches]

  @tf.function
  def steps(features, labels):
    del features, labels  # the workload's batches, all of them, instead
    total = tf.constant(0.0)
    for batch, batch_labels in constants:
      embedding.enqueue(batch, training=True)
      activations = embedding.dequeue()
      scale = 1e-3 * batch_labels[:, None]
      embedding.apply_gradients(
          {n: a * scale for n, a in activations.items()})
      total += activations[workload.names[0]][0, 0]
    return total

  return steps
