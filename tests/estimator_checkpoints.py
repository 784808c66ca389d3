"""TPUEstimator checkpoints for the tests of `tfemb.migrate`
(tests/migrate/), written the way TPUEstimator wrote them (TensorFlow
2.15's tpu_embedding.py / _tpu_estimator_embedding.py): TF1 `get_variable`
with `fixed_size_partitioner(num_hosts)`, a `Saver`, table variables named
by the feature columns' scopes or by the table, slots `<table>/Adagrad`,
`/Adam/m`, `/Adam/v`, `/Ftrl`, `/Ftrl_1`; under `partition_strategy="mod"`
host p holds ids p, p + hosts, ..."""

import numpy as np
import tensorflow as tf

USER = "input_layer/user_embedding/embedding_weights"
SHARED = "item_query_shared_embedding"
VIDEO = "video"  # a table_to_config_dict table
VOCAB, DIM, HOSTS = 23, 3, 3
SUFFIXES = {"sgd": {}, "adagrad": {"accumulators": "/Adagrad"},
            "adam": {"momenta": "/Adam/m", "velocities": "/Adam/v"},
            "ftrl": {"accumulators": "/Ftrl", "linears": "/Ftrl_1"}}


def mod_order(rows, hosts):
  """Checkpoint row -> id under "mod": host p's slice holds p, p+hosts..."""
  return np.concatenate([np.arange(p, rows, hosts) for p in range(hosts)])


def save_estimator_checkpoint(path, variables, hosts, strategy="div"):
  """Saves `{name: id-ordered values}` as TPUEstimator did, plus the dense
  model's variables."""
  with tf.Graph().as_default():
    parts = {}
    for name, values in variables.items():
      parts[name] = tf.compat.v1.get_variable(
          name, shape=values.shape, dtype=tf.float32, trainable=False,
          initializer=tf.compat.v1.zeros_initializer(),
          partitioner=tf.compat.v1.fixed_size_partitioner(
              min(hosts, values.shape[0])))
    tf.compat.v1.get_variable("dense/kernel", shape=[4, 1])
    tf.compat.v1.get_variable("dense/kernel/Adagrad", shape=[4, 1])
    tf.compat.v1.train.get_or_create_global_step()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for name, values in variables.items():
        stored = values
        if strategy == "mod":
          stored = values[mod_order(len(values), min(hosts, len(values)))]
        for part in parts[name]:
          offset = part._get_save_slice_info().var_offset[0]  # pylint: disable=protected-access
          sess.run(part.assign(stored[offset:offset + part.shape[0]]))
      return tf.compat.v1.train.Saver().save(sess, path)


def old_values(names, optimizer, seed=0, rows=VOCAB):
  rng = np.random.default_rng(seed)
  out = {}
  for name in names:
    out[name] = rng.normal(size=(rows, DIM)).astype(np.float32)
    for suffix in SUFFIXES[optimizer].values():
      out[name + suffix] = rng.uniform(0.1, 1, (rows, DIM)).astype(np.float32)
  return out
