"""The fused kernels' ops called directly, for the kernel benchmarks.

tfemb's own calls (`tfemb.kernels.fused_ops`) take a table's variables as the
host engine makes them and always run the build the process loaded. The
benchmarks time other arrangements: plain variables holding the slots
beside the parameters (`row_width`, `interleaved`) and another build of
the kernels (`library`: experiments/kernel_ab.py's). The update's
attributes are tfemb's (`fused_ops.update_attributes`).
"""

import tensorflow as tf

from tfemb import optimizers
from tfemb.kernels import build
from tfemb.kernels import fused_ops


def default_library():
  """tfemb's own build, as the host engine loads it."""
  library = build.load()
  if library is None:
    raise SystemExit("the fused kernels are off or could not be built")
  return library


def dedup_gather(library, table, variable, ids, feature_names,
                 row_width: int = 0):
  """`fused_ops.dedup_gather` on `variable`, whose rows are `row_width` wide
  with the parameters first (0: the table's `dim`)."""
  return library.tfemb_dedup_gather(
      table=variable.handle, ids=[tf.cast(i, tf.int64) for i in ids],
      vocabulary_size=table.vocabulary_size, dim=table.dim,
      feature_names=list(feature_names), table_name=table.name,
      row_width=row_width)


def row_gradients(library, table, grads, positions, unique_ids,
                  raise_non_finite=True):
  return library.tfemb_row_gradients(
      gradients=grads, positions=positions, unique_ids=unique_ids,
      table_name=table.name, raise_non_finite=raise_non_finite)


def apply_rows(library, table, variables, ids, grads, lr,
               interleaved: bool = False):
  """`fused_ops.apply_rows` on `variables` ({"parameters": ..., slot: ...}); with
  `interleaved`, `variables["parameters"]` holds the slots beside the
  parameters, in the optimizer's order."""
  slots = [] if interleaved else [
      variables[n].handle
      for n in optimizers.identify(table.optimizer).slots]
  attrs = dict(fused_ops.update_attributes(table.optimizer),
               parameters=variables["parameters"].handle, slots=slots,
               learning_rate=lr, interleaved=interleaved)
  try:  # one part
    return library.tfemb_apply_rows(ids=[ids], gradients=[grads],
                                    table_names=[table.name], **attrs)
  except TypeError:  # a build from before the op took parts (kernel_ab's)
    return library.tfemb_apply_rows(ids=ids, gradients=grads,
                                    table_name=table.name, **attrs)
