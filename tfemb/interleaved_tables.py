"""Tables whose slots sit beside their parameters, in one variable.

A step looks a table's rows up and then updates them with their slots. With
the parameters and each slot in variables of their own, the update goes to
1 + slots other places in memory for every row; with all of them side by
side in one `[rows, (1 + slots) x dim]` variable (the parameters first,
then the slots in the optimizer's order) each row is one place, and a
lookup's read of it can leave the page translation and the neighbouring
lines for the update. That counts in a training step's order, where every
table is looked up before any is updated and a row's lines are gone from
the caches when its update comes (`benchmarks/layout.py --order`
measures it).

Everyone else still sees TensorFlow's variables: the parameters and each
slot are a `ColumnView` (`tfemb.column_view`) of the storage, and the
fused kernels take the whole row (`tfemb.kernels.ops`).

Default for the tables that can take it (`wanted`); the option
`interleaved_slots=False` (`tfemb.options`) for the engine that creates
them keeps every table in variables of its own.
"""

from typing import Optional

import tensorflow as tf

from tfemb import optimizers
from tfemb import options
# An interleaved table's variables are views of its storage.
from tfemb.column_view import ColumnView  # pylint: disable=unused-import
from tfemb.kernels import build as kernel_build


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
          getattr(opt, "lazy_adam", True) and not partitioned and
          not tf.distribute.has_strategy() and
          not tf.config.list_logical_devices("GPU") and
          kernel_build.load(opts) is not None)

