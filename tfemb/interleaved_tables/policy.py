"""Which tables are created interleaved (`tfemb.interleaved_tables`)."""

from typing import Optional

import tensorflow as tf

from tfemb import optimizers
from tfemb import options
from tfemb.kernels import fused_ops


def wanted(table, partitioned: bool,
           opts: Optional[options.Options] = None) -> bool:
  """Whether `table` is created interleaved (called under the strategy).

  Tables with slots, on a single-replica CPU host (no distribution
  strategy, no parameter-server sharding, no GPU), trained by a lazy rule
  through the fused kernels, with TensorFlow's own slot creation, when
  `opts` (default: the current options) has `interleaved_slots` and
  `fused_kernels` on.
  """
  opts = options.get() if opts is None else opts
  opt = table.optimizer
  return (opts.interleaved_slots and optimizers.is_optimizer(opt) and
          bool(optimizers.identify(opt).slots) and
          opt.slot_variable_creation_fn is None and
          not tf.distribute.has_strategy() and
          not tf.config.list_logical_devices("GPU") and
          fused_ops.serves(opt, partitioned, opts))
