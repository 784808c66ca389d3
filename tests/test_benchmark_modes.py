"""benchmarks/lab/modes.py's head-alone step: the workload's Dense(1) head on
gathered activations, checked against numpy."""

import numpy as np
import tensorflow as tf

from benchmarks import workload as workload_lib
from benchmarks.lab import modes
import reference


def test_head_step_trains_the_numpy_reference():
  work = workload_lib.Workload(vocab=10, optimizer="sgd", features=3, dim=2,
                               batch=6, distinct_batches=1)
  step, tables, kernel = modes.head_step(work)
  features, labels = work.make_batches()[0]
  x = np.concatenate([t.numpy()[features[n]]
                      for t, n in zip(tables, work.names)], axis=1)
  w = kernel.numpy()
  want_loss, want_w = reference.linear_head_step(x, w, labels, modes.HEAD_LR)

  loss = step({n: tf.constant(v) for n, v in features.items()},
              tf.constant(labels))

  np.testing.assert_allclose(loss.numpy(), want_loss, rtol=1e-5)
  np.testing.assert_allclose(kernel.numpy(), want_w, rtol=1e-5, atol=1e-7)
  assert not np.allclose(want_w, w)  # the step changed the kernel
