"""Interleaved tables: a table's slots beside its parameters, in one variable.

A step looks a table's rows up and then updates them with their slots. With
the parameters and each slot in variables of their own, the update goes to
1 + slots other places in memory for every row; with all of them side by
side in one `[rows, (1 + slots) x dim]` variable, the storage (the
parameters first, then the slots in the optimizer's order), each row is one
place, and a lookup's read of it can leave the page translation and the
neighbouring lines for the update. That counts in a training step's order,
where every table is looked up before any is updated and a row's lines are
gone from the caches when its update comes (`experiments/layout.py --order`
measures it).

Everyone else still sees TensorFlow's variables: the parameters and each
slot are a `ColumnView` of their columns of the storage, a `tf.Variable` of
`[rows, dim]` with TensorFlow's name, read, assigned, differentiated
(through `tf.gather`) and checkpointed under the same keys as a plain
variable, so checkpoints move to and from TensorFlow's classes unchanged.
A SavedModel holds the storage and, as variables of their own, the views'
values (so twice the table's bytes); functions read the views with
TensorFlow's ops only, so exported graphs load without tfemb.

A checkpoint save would read every view, and columns cannot be read
without a copy (TensorFlow's saver takes all of a checkpoint's tensors at
once): that would need the tables' bytes a second time. Instead a save
splits each table (`fused_ops.split_columns`): its rows move into one
contiguous block per view, the saver writes slices of the blocks, and the
rows move back when the save is over, so saving takes no more memory than
with separate variables.
Restores write the views in place (`fused_ops.write_columns`).

The layout, one module per idea:

* `policy.wanted`: which tables take it. It is the default for the tables
  that can; the option `interleaved_slots=False` (`tfemb.options`) for the
  engine that creates them keeps every table in variables of its own.
* `storage.create`: a table's storage and its views, as the host engine's
  `TableStore` (`tfemb.host.table_store`) creates a table's variables.
* `column_view.ColumnView`, with its checkpoint save and restore and its
  SavedModel export; what it shares with the SparseCore's stacked views
  (`tfemb.sparsecore.stacked_variable`) is `tfemb.variable_view`.

Its kernels are the fused kernels' entry points in `tfemb.kernels.fused_ops`
that know the layout: `read_columns`, `write_columns`, `split_columns` and
`rejoin_columns` (a view's eager reads, writes and checkpoint save), and
`dedup_gather`, `apply_rows` and `restore_rows`, which take the whole row of
the storage behind a view (their `row_width` and `interleaved`
attributes). Their C++ is in `tfemb/kernels/src/`: `column_split.cc`
(and `column_split.h`) the save's split (`TfembSplitColumns`,
`TfembRejoinColumns`); `read_write_columns.cc` the columns' reads and
writes (`TfembReadColumns`, `TfembWriteColumns`); `dedup_gather.cc`,
`apply_rows.cc` and `apply_tables.cc` the whole-row lookup and update
(`TfembDedupGather`, `TfembApplyRows`, `TfembRestoreRows`,
`TfembApplyTables`).
"""

from tfemb.interleaved_tables.column_view import ColumnView
from tfemb.interleaved_tables.policy import wanted
from tfemb.interleaved_tables.storage import create

__all__ = ["ColumnView", "create", "wanted"]
