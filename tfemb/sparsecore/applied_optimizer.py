"""The optimizer as the SparseCore applies it, on the host.

* `host_optimizer`: TF 2.21's `TPUEmbeddingV2.apply_gradients` passes
  neither the gradient clipping (`clipvalue`) nor the weight clipping
  (`clip_weight_min` / `clip_weight_max`) to the SparseCore ops, so the host
  trains with a copy of the optimizer without them (and says so once per
  table);
* `check_weight_decay`: TF's constructor refuses weight decay.
"""

import copy
from typing import Any, List

from absl import logging

from tfemb import optimizers


def check_weight_decay(tables: List[Any]) -> None:
  """TensorFlow's `TPUEmbeddingV2.__init__`: no weight decay yet."""
  for table in tables:
    opt = table.optimizer
    if opt is None or optimizers.is_custom(opt):
      continue
    if (opt.weight_decay_factor is not None or
        opt.multiply_weight_decay_factor_by_learning_rate is not None):
      raise NotImplementedError(
          "weight_decay_factor and"
          " multiply_weight_decay_factor_by_learning_rate are not supported"
          f" yet. But found in table {table.name} setting.")


def host_optimizer(table) -> Any:
  """The table's optimizer as the SparseCore applies it: without gradient
  or weight clipping (a copy; the user's object is unchanged)."""
  opt = table.optimizer
  if opt is None or optimizers.is_custom(opt):
    return opt
  ignored = [name for name, value in (
      ("clipvalue", (opt.clip_gradient_min, opt.clip_gradient_max)),
      ("clip_weight_min", opt.clip_weight_min),
      ("clip_weight_max", opt.clip_weight_max)) if value not in (None, (None,
                                                                      None))]
  if not ignored:
    return opt
  logging.warning(
      "Table %r: %s has no effect on a SparseCore (TensorFlow's "
      "TPUEmbeddingV2 does not pass it to the SparseCore's update); the "
      "host ignores it too.", table.name, " and ".join(ignored))
  opt = copy.copy(opt)
  opt.clip_gradient_min = opt.clip_gradient_max = None
  opt.clip_weight_min = opt.clip_weight_max = None
  return opt
