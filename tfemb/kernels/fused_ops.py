"""The fused kernels as functions of the host engine's tensors and configs.

`usable(variables, optimizer, partitioned, opts)` tells whether a table's
variables can take them: the kernels on in `opts` (`tfemb.options`) and
built, a lazy rule, resource variables on the CPU, plain or mirrored (`MirroredStrategy`,
`MultiWorkerMirroredStrategy`: each replica's kernels work on its own
copy), not sharded over parameter servers, not on a GPU. Each function
below is one op per table, run by the build this process loaded
(`build.load`):

* `dedup_gather(table, ids, ...)`: the distinct ids of every feature of the
  table, each id's position among them, and each id's row; ids outside
  `[0, vocabulary_size)` raise, naming the feature.
* `row_gradients(grads, positions, unique_ids, ...)`: the summed gradient of
  each distinct row and whether it is finite (or raise, naming the table).
* `apply_rows(table, variables, ids, grads, lr)`: the table's optimizer on
  those rows, in place (docs/numerics.md, "The update"; lazy), all or
  nothing: whether the new rows and slots are finite (else nothing
  changed), and the rows as they were; `restore_rows(...)` puts them back
  when the step as a whole is not finite.
* `apply_tables(tables, variables, ids, grads, lrs, gradients_finite,
  positions)`: `apply_rows` on several tables of one rule (`update_key`)
  in one op, all or nothing by itself: a step's whole update, with no lock
  around it and nothing to restore after it. With `positions` it sums each
  table's per-id gradients itself first (as `row_gradients`).
* `read_columns`, `write_columns`, `split_columns`, `rejoin_columns`: an
  interleaved table's columns (`tfemb.interleaved_tables`), read, written,
  and saved without a second copy of the table.
* `advise_huge_pages(variable)`: 2 MiB pages for a table created empty.
* `id_counts(ids, samples, ...)`: the ids, and the distinct ids,
  of each SparseCore cell of a chip's batch
  (`tfemb.sparsecore.id_limit_ops`).

Every op checks the shapes and dtypes of what it is given (a scalar
learning rate, vector ids, gradient rows matching the ids, float32
variables of the table's shape, attributes in range) and raises
`tf.errors.InvalidArgumentError` otherwise, before it writes anything: no
input aborts the process (tests/kernels/test_kernel_input_validation.py).

The update's rule and constants come from the optimizer's declaration
(`tfemb.optimizers.identify`): the constants are the values its rule in
`tfemb.update_rules` uses, computed in Python the same way, so the kernel
rounds as it does.
"""

import dataclasses
import math
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import tensorflow as tf
from tensorflow.python.framework import auto_control_deps_utils  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import

from tfemb import optimizers
from tfemb import options
from tfemb import replicas
from tfemb import variable_view
from tfemb.kernels import build

for _op in ("TfembDedupGather", "TfembRowGradients", "TfembApplyRows",
            "TfembRestoreRows", "TfembApplyTables", "TfembIdCounts",
            "TfembWriteColumns", "TfembSplitColumns", "TfembRejoinColumns"):
  tf.no_gradient(_op)
# A lookup only reads its table (under a shared lock): in a tf.function it
# is ordered only after the writes before it, as TensorFlow's own
# ResourceGather.
auto_control_deps_utils.register_read_only_resource_op("TfembDedupGather")


# The columns of an interleaved table's storage are the view's value
# (`tfemb.interleaved_tables`): a tape watching the view (its handle is the
# storage's) gets the gradient of the `[rows, width]` view, as it would of a
# plain variable's read.
@tf.RegisterGradient("TfembReadColumns")
def _read_columns_gradient(op, grad):
  del op
  return [grad]


def serves(optimizer, partitioned: bool,
           opts: Optional[options.Options] = None) -> bool:
  """Whether the fused kernels train a table of `optimizer`, before its
  variables exist: built and on under `opts` (default: the current
  options), a lazy rule (`optimizers.is_lazy`: non-lazy Adam updates every
  row, TensorFlow's ops), and tables not partitioned over parameter
  servers. `usable` adds what the variables must be."""
  return (not partitioned and optimizers.is_lazy(optimizer) and
          build.load(opts) is not None)


def usable(variables: Dict[str, tf.Variable], optimizer, partitioned: bool,
           opts: Optional[options.Options] = None) -> bool:
  """The one answer to whether the fused kernels train this table: they
  serve it (`serves`) and every variable is a plain resource variable on a
  CPU (not sharded, sync-on-read or otherwise wrapped)."""
  if not serves(optimizer, partitioned, opts):
    return False
  for v in variables.values():
    for copy in replicas.copies(_storage(v)):
      if not isinstance(copy, resource_variable_ops.BaseResourceVariable):
        return False
      if "CPU" not in copy.device.upper():
        return False
  return True


def in_place_here(variables: Dict[str, tf.Variable]) -> bool:
  """Whether an update here may write the table in place: always, except
  for a table with several mirrored copies outside a replica's context of
  its own strategy (there a write must reach every copy: TensorFlow's
  mirrored ops)."""
  for v in variables.values():
    v = _storage(v)
    if len(replicas.copies(v)) > 1 and not replicas.in_replica_context_of(
        v.distribute_strategy):
      return False
  return True


def _storage(variable):
  """The variable that holds it: itself, or for a column view of an
  interleaved table (`tfemb.interleaved_tables`) the whole table's."""
  return variable_view.storage_of(variable)


def _library():
  """The kernels this process loaded: whoever calls an op here has found
  them usable (`usable`, `advise_huge_pages`) or holds an interleaved
  table, which only they make."""
  return build.load(dataclasses.replace(options.get(), fused_kernels=True))


def _handle(variable):
  """The handle of the variable that holds it, its use recorded as
  TensorFlow's own variable ops record it (so functions that use it track
  it, e.g. for export)."""
  variable = replicas.local_copy(_storage(variable))
  resource_variable_ops.variable_accessed(variable)
  return variable.handle


def _row_width(variable) -> int:
  """The width of an interleaved table's storage; 0 for a plain variable."""
  storage = _storage(variable)
  return 0 if storage is variable else int(storage.shape[1])


def advise_huge_pages(variable,
                      opts: Optional[options.Options] = None) -> None:
  """Asks Linux for 2 MiB pages under each CPU copy of `variable`, a table
  created empty, before it is filled: the fill's page faults then take huge
  pages, and the first step has none to collapse (`src/huge_pages.cc`).
  Nothing without the kernels (`opts`, default the current options),
  outside eager execution, or for copies that are not CPU resource
  variables."""
  library = build.load(opts)
  if library is None or not tf.executing_eagerly():
    return
  for copy in replicas.copies(variable):
    if (isinstance(copy, resource_variable_ops.BaseResourceVariable) and
        "CPU" in copy.device.upper()):
      with tf.device(copy.device):
        library.tfemb_advise_huge_pages(table=copy.handle)


def read_columns(storage, begin: int, width: int) -> tf.Tensor:
  """Columns [begin, begin + width) of `storage`, without a copy of the
  whole storage."""
  return _library().tfemb_read_columns(table=storage.handle, begin=begin,
                                       width=width)


def write_columns(storage, begin: int, value, row: int = 0) -> None:
  """`value` into rows [row, row + len(value)) of columns [begin, begin +
  width) of `storage`, in place (no copy of the storage)."""
  _library().tfemb_write_columns(table=storage.handle, value=value,
                                 row=tf.constant(row, tf.int64), begin=begin)


def split_columns(storage, parts: int) -> tf.Tensor:
  """`storage` ([rows, parts x width]) as `[parts, rows, width]` blocks, for
  a checkpoint save: the storage's rows move into the blocks (its memory
  given back) and return when the blocks' last tensor is gone
  (`src/column_split.cc`)."""
  return _library().tfemb_split_columns(table=storage.handle, parts=parts)


def rejoin_columns(storage) -> None:
  """Puts `storage`'s rows back now if a save has split them."""
  _library().tfemb_rejoin_columns(table=storage.handle)


def id_counts(ids: Sequence[tf.Tensor],
              samples: Sequence[Optional[tf.Tensor]], **attributes):
  """`(runs, distinct)`, int64 `[stacks, cores x partitions]`: each cell's
  ids and distinct ids (`distinct` `[0, ...]` unless `count_distinct`).
  `samples`: each id's, or None (id k is sample k). `attributes`:
  TfembIdCounts' (`src/id_counts.cc`)."""
  empty = tf.zeros([0], tf.int64)
  return _library().tfemb_id_counts(
      ids=list(ids), samples=[empty if s is None else s for s in samples],
      **attributes)


def dedup_gather(table, variable, ids: Sequence[tf.Tensor],
                 feature_names: Sequence[str], remap=None):
  """(unique_ids [u], positions [n], rows [n, dim]) for the table's ids.

  `variable`: the table's parameters, a plain variable or a column view of
  an interleaved table (whose storage the kernel reads). `remap`: for a
  table in the SparseCore's layout (`tfemb.host.table_paths.Remap`), ids are
  checked against its own vocabulary and `unique_ids` are the variable's
  rows.
  """
  vocabulary_size, stacked = table.vocabulary_size, []
  if remap is not None:
    vocabulary_size, stacked = remap.vocabulary_size, list(remap.kernel_attr)
  return _library().tfemb_dedup_gather(
      table=_handle(variable), ids=[tf.cast(i, tf.int64) for i in ids],
      vocabulary_size=vocabulary_size, dim=table.dim,
      feature_names=list(feature_names), table_name=table.name,
      row_width=_row_width(variable), stacked=stacked)


def row_gradients(table, grads, positions, unique_ids, raise_non_finite):
  """(row gradients [u, dim], finite) summed in the order of the ids."""
  return _library().tfemb_row_gradients(
      gradients=grads, positions=positions, unique_ids=unique_ids,
      table_name=table.name, raise_non_finite=raise_non_finite)


def _bounds(lower, upper) -> List[float]:
  return [-math.inf if lower is None else float(lower),
          math.inf if upper is None else float(upper)]


def update_attributes(opt) -> Dict[str, Any]:
  """TfembApplyRows' attributes for optimizer `opt`: its rule and
  constants (from its declaration), clipping bounds and weight decay."""
  declaration = optimizers.identify(opt)
  return dict(
      rule=declaration.name,
      hyperparameters=list(declaration.kernel_constants(opt).values()),
      clip_gradient=_bounds(opt.clip_gradient_min, opt.clip_gradient_max),
      clip_weight=_bounds(opt.clip_weight_min, opt.clip_weight_max),
      weight_decay_factor=float(opt.weight_decay_factor or 0.0),
      multiply_weight_decay_by_lr=bool(
          opt.multiply_weight_decay_factor_by_learning_rate))


class Applied(NamedTuple):
  """What `apply_rows` returns."""
  finite: tf.Tensor  # bool scalar: the new rows and slots were all finite
  undo: tf.Tensor  # the rows and slots as they were, for `restore_rows`


def _variable_inputs(table, variables) -> Dict[str, Any]:
  """The kernels' variable inputs and layout attribute for `table`'s
  variables: the parameters, and each slot unless they sit beside the
  parameters in one interleaved storage."""
  interleaved = bool(_row_width(variables["parameters"]))
  slots = [] if interleaved else [
      _handle(variables[n])
      for n in optimizers.identify(table.optimizer).slots]
  return dict(parameters=_handle(variables["parameters"]), slots=slots,
              interleaved=interleaved)


def apply_rows(table, variables, ids, grads, lr) -> Applied:
  """The optimizer of `table` on rows `ids` of its variables, in place, all
  or nothing: where a new value of a row or slot would not be finite,
  every row is left as it was (`finite` False). Each update is computed
  once; `undo` keeps the rows and slots as they were, so that
  `restore_rows` can take the update back when another table of the step
  is not finite.

  `variables`: the table's, by name ("parameters" and each slot's). When
  the parameters are a column view of an interleaved table, its storage
  holds the slots too: [rows, (1 + slots) x dim], the parameters first,
  then each slot in the optimizer's order.
  """
  # The kernels take several parts (tables sharing one variable and
  # optimizer, disjoint rows); the engine gives each table a variable of
  # its own, so one part.
  finite, undo = _library().tfemb_apply_rows(
      ids=[ids], gradients=[grads], learning_rate=lr,
      table_names=[table.name], **_variable_inputs(table, variables),
      **update_attributes(table.optimizer))
  return Applied(finite[0], undo)


def update_key(table, variables) -> tuple:
  """What tables must share to be updated by one `apply_tables`: the
  rule, its constants, clipping and weight decay, and the layout of the
  slots (beside the parameters or not)."""
  attributes = update_attributes(table.optimizer)
  return (tuple((k, tuple(v) if isinstance(v, list) else v)
                for k, v in sorted(attributes.items())),
          bool(_row_width(variables["parameters"])))


def apply_tables(tables, variables, ids, grads, lrs, gradients_finite,
                 positions=None, raise_non_finite=False) -> List[tf.Tensor]:
  """`apply_rows` on every table of `tables` (one `update_key`), with
  `variables`, `ids`, `grads` and learning rates `lrs` by table, in one op:
  each table's new rows and slots are written in place and all are put
  back if any is not finite. Returns whether each table's new values are
  finite. Unless `gradients_finite` (a bool scalar), nothing is computed or
  written (and every table's answer is True).

  With `positions` (by table), `grads` are one row per id looked up, and
  the op sums each table's into its distinct ids' rows at those positions
  (as `row_gradients`) right before its update; a table whose sum is not
  finite answers False, and nothing is written. With `raise_non_finite`,
  the op then fails naming that table instead. A table's per-id `grads`
  may be a list of pieces, its rows one piece after the other: the op
  reads them where they are, without joining them.
  """
  inputs = [_variable_inputs(t, v) for t, v in zip(tables, variables)]
  pieces = [list(g) if isinstance(g, (list, tuple)) else [g] for g in grads]
  return _library().tfemb_apply_tables(
      variables=[h for i in inputs for h in [i["parameters"]] + i["slots"]],
      ids=list(ids), gradients=[g for p in pieces for g in p],
      gradient_pieces=([len(p) for p in pieces]
                       if any(len(p) != 1 for p in pieces) else []),
      positions=list(positions) if positions is not None else [],
      learning_rates=list(lrs), gradients_finite=gradients_finite,
      table_names=[t.name for t in tables],
      interleaved=inputs[0]["interleaved"],
      raise_non_finite=raise_non_finite,
      **update_attributes(tables[0].optimizer))


def restore_rows(table, variables, ids, applied: Applied, keep):
  """Unless `keep` (a bool scalar), the rows and slots `apply_rows` updated
  as they were before it. With `keep` it reads and locks nothing."""
  return _library().tfemb_restore_rows(
      ids=[ids], undo=applied.undo, keep=keep, table_names=[table.name],
      **_variable_inputs(table, variables))
