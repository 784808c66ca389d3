"""Which strategies are TPU strategies, decided in one place.

TensorFlow's two TPUStrategy classes, `tf.distribute.TPUStrategy`
(`TPUStrategyV2`) and `tf.distribute.experimental.TPUStrategy` (the V1
class), as TensorFlow's engines and tensorflow-recommenders ask. A host
`TPUStrategy` (`tfemb.tpu.host.strategy`) derives from both, so it is one:
a program's TPU branches run under it. Whether TensorFlow's own engines do
the work is another question, `tfemb.tpu.delegate.on_tpu`'s.
"""

from typing import Any

import tensorflow as tf

TPU_STRATEGIES = (tf.distribute.TPUStrategy,
                  tf.distribute.experimental.TPUStrategy)


def is_tpu_strategy(strategy: Any) -> bool:
  """Whether `strategy` is a TPU strategy: a TPU's, or a host one."""
  return isinstance(strategy, TPU_STRATEGIES)
