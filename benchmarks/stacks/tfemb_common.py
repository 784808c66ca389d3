"""tfemb configs for the workload: a table per feature, the TPU optimizer."""

import tfemb


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
  """`steps` distinct batches of the workload as constant tensors, each
  with a stand-in gradient per feature: `[(features, gradients)]`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  batches = workload.make_batches()[:steps]
  assert len(batches) == steps, "fewer distinct batches than steps"
  rng = np.random.default_rng(workload.seed)
  return [({n: tf.constant(ids) for n, ids in features.items()},
           {n: tf.constant(1e-3 * rng.standard_normal(
               (len(ids), workload.dim), dtype=np.float32))
            for n, ids in features.items()})
          for features, _ in batches]
