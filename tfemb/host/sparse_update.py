"""The sparse update: a table's optimizer applied to the rows a step touched.

Gathers the touched rows of the table and of each slot, runs
`update_rules.apply` on them, and scatters the results back (TensorFlow's
resource gather and scatter ops, routed per shard for sharded tables), or,
with `fused=True`, does all of it in place in one `tfemb.kernels` op.
Non-lazy Adam, as on the TPU, updates every row instead.
"""

import tensorflow as tf

from tfemb import update_rules
from tfemb.kernels import ops as kernel_ops
from tfemb.host.variables import gather_rows


def update_table(table, variables, ids, w, grads, fused=False):
  """Applies the table's optimizer to the touched rows and their slots.

  `variables` is the table's `{"parameters": .., slot: ..}`. `w` holds the
  rows as `dequeue` gathered them (the values before this step), so the
  parameters are not gathered twice; None: gather them. `fused`: the table
  can take the fused kernel (`kernel_ops.usable`).
  """
  opt = table.optimizer
  if opt is None:
    raise RuntimeError(
        f"Table {table.name!r} has no optimizer: pass one to TPUEmbedding "
        "or the TableConfig to train it.")
  slot_names = opt._slot_names()  # pylint: disable=protected-access
  lr = update_rules.learning_rate(opt)
  if fused:
    kernel_ops.apply_rows(table, variables, ids, grads, lr)
    return
  if getattr(opt, "lazy_adam", True):
    if w is None:
      w = gather_rows(variables["parameters"], ids)
    slots = {n: gather_rows(variables[n], ids) for n in slot_names}
    new_w, new_slots = update_rules.apply(opt, w, grads, slots, lr)
    for n in slot_names:
      variables[n].scatter_update(tf.IndexedSlices(new_slots[n], ids))
    variables["parameters"].scatter_update(tf.IndexedSlices(new_w, ids))
  else:
    # Non-lazy Adam: every row sees this step (zero gradient if untouched).
    dense_grads = tf.scatter_nd(ids[:, None], grads,
                                [table.vocabulary_size, table.dim])
    w = variables["parameters"].read_value()
    slots = {n: variables[n].read_value() for n in slot_names}
    new_w, new_slots = update_rules.apply(opt, w, dense_grads, slots, lr)
    for n in slot_names:
      variables[n].assign(new_slots[n])
    variables["parameters"].assign(new_w)
