"""tfemb configs for the workload: a table per feature, the TPU optimizer."""

import os

import tfemb


def steps_per_call() -> int:
  """Steps per `tf.function` call of the embedding-only stacks: 32, or
  `TFEMB_STEPS_PER_CALL` (1: each step in a call of its own, as Keras'
  default `steps_per_execution` runs them). A call itself costs about 1.3
  ms on the suite's host (Python binding the arguments, the executor
  starting and finishing): 32 steps share it, so that it adds about 0.04
  ms to a step of the embedding part, not the 0.16 ms of 8 steps."""
  return int(os.environ.get("TFEMB_STEPS_PER_CALL", "32"))


def optimizer(workload):
  cls = {"sgd": tfemb.SGD, "adagrad": tfemb.Adagrad,
         "adam": tfemb.Adam}[workload.optimizer]
  return cls(learning_rate=workload.learning_rate)


def feature_config(workload):
  return {
      n: tfemb.FeatureConfig(
          tfemb.TableConfig(workload.vocab, workload.dim, name=f"table_{n}",
                            combiner="sum"), name=n)
      for n in workload.names
  }


def fixed_batches(workload, steps):
  """`steps` batches of the workload as constant tensors, each with a
  stand-in gradient per feature: `[(features, gradients)]`; the workload's
  distinct batches, cycled (the same tensors again) beyond their number."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  batches = workload.make_batches()[:steps]
  rng = np.random.default_rng(workload.seed)
  distinct = [({n: tf.constant(ids) for n, ids in features.items()},
               {n: tf.constant(1e-3 * rng.standard_normal(
                   (len(ids), workload.dim), dtype=np.float32))
                for n, ids in features.items()})
              for features, _ in batches]
  return [distinct[i % len(distinct)] for i in range(steps)]


def embedding_steps(workload, steps_per_call, one_step):
  """A tf.function running `one_step(batch, gradients)` (which returns the
  activations) on `steps_per_call` fixed batches, for the embedding-only
  stacks (the child divides the time by `steps_per_call`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  constants = fixed_batches(workload, steps_per_call)

  @tf.function
  def steps(features, labels):
    del features, labels  # the workload's batches, all of them, instead
    total = tf.constant(0.0)
    for batch, gradients in constants:
      total += one_step(batch, gradients)[workload.names[0]][0, 0]
    return total

  return steps
