"""What a host engine's step refuses before it traces anything.

- XLA (`jit_compile=True`): the step runs TensorFlow ops XLA does not
  compile (`tf.unique` of a batch's ids, sparse row updates, tfemb's fused
  kernels). On a TPU, TensorFlow's engines compile with the step on the
  TPU's own embedding ops; on the CPU, under a host `TPUStrategy` as
  anywhere, the step runs uncompiled. Refusing at trace time names the
  cause, where XLA would report an op it cannot place.
- Another TPU strategy: under a host `TPUStrategy` (`tfemb.patch(tpu=...)`;
  a host engine never runs under a TPU's own, where TensorFlow's engines
  do the work), an engine runs under the strategy it was created under,
  whose replicas hold its tables.

Both raise a plain `ValueError`, which `tf.function`'s AutoGraph passes on
as it is.
"""

import tensorflow as tf
from tensorflow.python.ops import control_flow_util  # pylint: disable=g-direct-tensorflow-import

from tfemb import tpu_strategies


def refuse_xla(what: str) -> None:
  """Raises if tracing under XLA."""
  graph = tf.compat.v1.get_default_graph()
  if control_flow_util.GraphOrParentsInXlaContext(graph):
    raise ValueError(
        f"{what} runs on tfemb's host engine, which XLA cannot compile "
        "(jit_compile=True): its step uses TensorFlow ops XLA has no "
        "kernels for (tf.unique of the ids, sparse row updates, tfemb's "
        "kernels). On a TPU TensorFlow compiles the embedding step with its "
        "own TPU ops; on the CPU run it uncompiled: tf.function without "
        "jit_compile=True, or Keras' model.compile(jit_compile=False).")


def check_strategy(created, what: str) -> None:
  """Raises if `what`, created under `created`, runs under another TPU
  strategy (or under another strategy while created under a TPU's)."""
  current = tf.distribute.get_strategy()
  if current is created or not tf.distribute.has_strategy():
    return  # outside any strategy: a TPU loop's enqueue
  if (tpu_strategies.is_tpu_strategy(created) or
      tpu_strategies.is_tpu_strategy(current)):
    raise ValueError(
        f"{what} was created under {created!r} and is used under "
        f"{current!r}: its tables live on the replicas of the strategy it "
        "was created under. Create the embedding under the strategy that "
        "runs it; one TPU program has one TPUStrategy.")
