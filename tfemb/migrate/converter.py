"""TPUEstimator checkpoint -> `tf.train.Checkpoint` for `tfemb.TPUEmbedding`.

For each table: find its optimizer's slot variables by TPUEstimator's names,
then copy the table and its slots block by block (in id order, undoing the
"mod" partitioning if asked) into the new checkpoint under tfemb's names.

Every refusal is an `errors.ConversionError` (a ValueError) that names the
checkpoint or file it concerns. The output appears only once whole
(`checkpoint_writer`); the source checkpoint and its directory's
`checkpoint` file are never written.
"""

import numbers
import os
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Optional

from tfemb.migrate import checkpoint_writer
from tfemb.migrate import errors
from tfemb.migrate import estimator_names
from tfemb.migrate import row_reader

DEFAULT_BLOCK_BYTES = 64 << 20


def print_progress(message: str):
  print(message, file=sys.stdout, flush=True)


def resolve_input(path: str) -> str:
  """A checkpoint prefix, or the latest checkpoint of a directory."""
  return row_reader.latest(path) if os.path.isdir(path) else path


class TableConversion(NamedTuple):
  """How one checkpoint variable converts."""
  table: str  # the tfemb table name
  shape: List[int]
  optimizer: str  # "SGD", "Adagrad", "Adam" or "FTRL", from the slots
  slots: Dict[str, str]  # tfemb slot name -> checkpoint variable
  ignored: List[str]  # variables under the table's name, not converted


def describe(input_path: str, tables: Optional[Dict[str, str]] = None
            ) -> Dict[str, TableConversion]:
  """`{checkpoint variable: TableConversion}` for the tables `convert_checkpoint`
  would convert (by default, every feature-column table)."""
  prefix = resolve_input(input_path)
  with errors.about(prefix):
    return _plan(row_reader.RowReader(prefix), tables)


def _plan(reader, tables):
  if tables is None:
    tables = estimator_names.find_tables(reader.shapes)
  names = list(tables.values())
  twice = sorted({name for name in names if names.count(name) > 1})
  if twice:
    raise ValueError(f"Several variables would become table(s) {twice}: "
                     "give each table its own name.")
  out = {}
  for variable, table in tables.items():
    reader.check_table(variable)
    optimizer, slots = estimator_names.find_slots(variable, reader.shapes)
    for slot_variable in slots.values():
      reader.check_table(slot_variable, reader.shapes[variable])
    ignored = estimator_names.unrecognised_children(variable, slots,
                                                    reader.shapes)
    out[variable] = TableConversion(table, reader.shapes[variable], optimizer,
                              slots, ignored)
  return out


class _Progress:
  """Prints a table's progress at most every `interval` seconds."""

  def __init__(self, report: Callable[[str], None], interval: float = 2.0):
    self._report, self._interval, self._last = report, interval, 0.0

  def __call__(self, message: str, final: bool = False):
    now = time.monotonic()
    if final or now - self._last >= self._interval:
      self._report(message)
      self._last = now


def convert_checkpoint(input_path: str,
                       output_prefix: str,
                       tables: Optional[Dict[str, str]] = None,
                       root: str = "embedding",
                       partition_strategy: str = "div",
                       num_hosts: Optional[int] = None,
                       block_rows: Optional[int] = None,
                       overwrite: bool = False,
                       progress: Optional[Callable[[str], None]] = (
                           print_progress)) -> str:
  """Converts TPUEstimator's embedding tables and slots for tfemb.

  Args:
    input_path: a TPUEstimator checkpoint prefix (or its directory).
    output_prefix: where to write the new checkpoint.
    tables: `{checkpoint variable: tfemb table name}`; by default every
      feature-column table, named as TPUEstimator named it (`tbl_...`).
    root: the path from the `tf.train.Checkpoint` to the `TPUEmbedding`.
    partition_strategy: the `EmbeddingConfigSpec`'s ("div" or "mod").
    num_hosts: the number of TPU hosts; read from the checkpoint if None.
    block_rows: rows per block (default: about 64 MiB per variable).
    overwrite: replace an existing checkpoint at `output_prefix`.
    progress: called with progress lines (None: quiet).

  Returns:
    `output_prefix`. `tf.train.Checkpoint(**{root: embedding}).restore(it)`
    loads it into a `tfemb.TPUEmbedding` (or TensorFlow's) whose tables have
    these names and whose optimizer has these slots.
  """
  _check_arguments(input_path, partition_strategy, num_hosts, block_rows)
  report = progress or (lambda message: None)
  prefix = resolve_input(input_path)
  _check_output(prefix, output_prefix, overwrite)
  with errors.about(prefix):
    reader = row_reader.RowReader(prefix)
    plan = _plan(reader, tables)
  if not plan:
    raise errors.ConversionError(
        prefix, "no embedding tables found: name them with tables= "
        "(--table VARIABLE=TABLE); list the checkpoint's variables with "
        "tf.train.list_variables.")
  with errors.about(output_prefix):
    writer = checkpoint_writer.CheckpointWriter(output_prefix, root)
  try:
    for n, (variable, entry) in enumerate(plan.items()):
      report(f"[{n + 1}/{len(plan)}] {variable} -> {entry.table}: "
             f"{entry.shape[0]} x {entry.shape[1]}, {entry.optimizer} slots "
             f"{sorted(entry.slots)}")
      if entry.ignored:
        report(f"  not converted (not TPU embedding slots): {entry.ignored}")
      with errors.about(prefix):
        _copy_table(reader, writer, variable, entry, partition_strategy,
                    num_hosts, block_rows, _Progress(report))
    with errors.about(output_prefix):
      recorded = writer.finish()
  except BaseException:
    writer.abort()
    raise
  report(f"wrote {output_prefix}")
  if not recorded:
    report(f"  {os.path.dirname(os.path.abspath(output_prefix))}/checkpoint "
           "names another checkpoint and was left as it was: restore "
           f"{output_prefix} by its prefix")
  return output_prefix


def _check_arguments(input_path, partition_strategy, num_hosts, block_rows):
  """The arguments' own ranges, before anything is read or written."""
  checks = [
      (partition_strategy in ("div", "mod"),
       f"partition_strategy (--partition-strategy) must be 'div' or 'mod', "
       f"got {partition_strategy!r}."),
      (_count(num_hosts),
       f"num_hosts (--num-hosts) must be at least 1, got {num_hosts!r}."),
      (_count(block_rows),
       f"block_rows (--block-rows) must be at least 1, got {block_rows!r}."),
  ]
  for ok, reason in checks:
    if not ok:
      raise errors.ConversionError(input_path, reason)


def _count(value) -> bool:
  """None (the default), or an integer of at least 1."""
  return value is None or (isinstance(value, numbers.Integral) and
                           not isinstance(value, bool) and value >= 1)


def _check_output(prefix, output_prefix, overwrite):
  if not output_prefix:
    raise errors.ConversionError(prefix, "no output prefix given.")
  if os.path.abspath(output_prefix) == os.path.abspath(prefix):
    raise errors.ConversionError(
        output_prefix, "is the checkpoint being converted; write the "
        "converted one under another prefix.")
  if os.path.exists(output_prefix + ".index") and not overwrite:
    raise errors.ConversionError(
        output_prefix, "a checkpoint exists here; pass overwrite=True "
        "(--overwrite) to replace it.")


def _copy_table(reader, writer, variable, plan, strategy, num_hosts,
                block_rows, progress):
  table, shape = plan.table, plan.shape
  names = [variable] + list(plan.slots.values())
  hosts = 1
  if strategy == "mod":
    hosts = reader.hosts(variable, num_hosts)
    for name in names[1:]:
      reader.hosts(name, hosts)  # Slots are partitioned like their table.
  if block_rows is None:
    block_rows = max(1, DEFAULT_BLOCK_BYTES // (4 * shape[1] * len(names)))
  streams = [reader.blocks(name, block_rows, strategy, hosts)
             for name in names]
  local_names = [f"{table}/{slot}" for slot in plan.slots]
  done = 0
  for blocks in zip(*streams):
    start = blocks[0][0]
    with errors.about(writer.output_prefix):
      writer.write_rows(table, shape, start, [rows for _, rows in blocks],
                        local_names)
    done = start + blocks[0][1].shape[0]
    progress(f"  {table}: {done}/{shape[0]} rows "
             f"({100.0 * done / shape[0]:.0f}%)", final=done == shape[0])
  if done != shape[0]:  # never a checkpoint short of rows
    raise ValueError(f"Variable {variable!r}: {done} of its {shape[0]} rows "
                     "were read.")
