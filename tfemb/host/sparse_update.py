"""The sparse update: a table's optimizer applied to the rows a step touched.

`new_rows` gathers the touched rows of the table and of each slot and runs
`update_rules.apply` on them; `write_rows` scatters the results back
(TensorFlow's resource gather and scatter ops, routed per shard for sharded
tables). Non-lazy Adam, as on the TPU, updates every row instead. With the
fused kernels, `tfemb.kernels` applies the update in place instead
(`apply_rows`, computing each row once, and `restore_rows`).
"""

from typing import Dict, List

import tensorflow as tf

from tfemb import optimizers
from tfemb import update_rules
from tfemb.host.row_reads import gather_rows


def optimizer_of(table):
  """The table's optimizer; a table without one cannot be trained."""
  if table.optimizer is None:
    raise RuntimeError(
        f"Table {table.name!r} has no optimizer: pass one to TPUEmbedding "
        "or the TableConfig to train it.")
  return table.optimizer


def new_rows(table, variables, ids, grads, lr) -> Dict[str, tf.Tensor]:
  """The table's rows `ids` and their slots after this step's update, from
  their values now: `{"parameters": .., slot: ..}` (non-lazy Adam: every
  row, with a zero gradient for the untouched ones)."""
  opt = optimizer_of(table)
  names = optimizers.slot_names(opt)
  if optimizers.is_lazy(opt):
    read = lambda v: gather_rows(v, ids)
  else:
    grads = tf.scatter_nd(ids[:, None], grads,
                          [table.vocabulary_size, table.dim])
    read = lambda v: v.read_value()
  new_w, new_slots = update_rules.apply(
      optimizers.identify(opt).rule, opt, read(variables["parameters"]),
      grads, {n: read(variables[n]) for n in names}, lr)
  return dict(new_slots, parameters=new_w)


def write_rows(table, variables, ids, values: Dict[str, tf.Tensor]) -> List:
  """Writes what `new_rows` computed; returns the writes."""
  if optimizers.is_lazy(table.optimizer):
    write = lambda v, x: v.scatter_update(tf.IndexedSlices(x, ids))
  else:
    write = lambda v, x: v.assign(x)
  return [write(variables[name], value) for name, value in values.items()]
