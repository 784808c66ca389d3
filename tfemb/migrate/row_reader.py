"""Reads a checkpoint variable block by block, in embedding-id order.

`tf.train.load_checkpoint` gives the names and shapes; the rows are read with
`RestoreV2` and a slice spec, so only one block of rows is in memory at a
time, whether the variable was saved whole or (as TPUEstimator saved tables)
as a PartitionedVariable of row slices.

TPUEstimator's slices were one per host (`fixed_size_partitioner`: the first
`rows % hosts` slices one row longer). With `partition_strategy="div"` they
hold consecutive ids, so checkpoint rows are already in id order. With
`"mod"`, host `p` held ids `p, p + hosts, ...`: checkpoint row
`offset[p] + j` is id `j * hosts + p`, and `blocks` undoes that.
"""

import os
import re
from typing import Iterator, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.python.training import checkpoint_state_pb2  # pylint: disable=g-direct-tensorflow-import

from tfemb.migrate import errors


def _partition_sizes(rows: int, parts: int) -> List[int]:
  """`fixed_size_partitioner`'s row counts."""
  return [rows // parts + (1 if p < rows % parts else 0) for p in range(parts)]


def checkpoint_state(directory: str
                    ) -> Optional[checkpoint_state_pb2.CheckpointState]:
  """The directory's `checkpoint` file, parsed; None if it has none.
  (`tf.train.get_checkpoint_state` logs and ignores a damaged one.)"""
  path = os.path.join(directory, "checkpoint")
  if not os.path.exists(path):
    return None
  try:
    with open(path, "rb") as f:
      return text_format.Parse(f.read().decode("utf-8"),
                               checkpoint_state_pb2.CheckpointState())
  except (OSError, ValueError, text_format.ParseError) as e:
    raise errors.ConversionError(
        path, f"not a checkpoint state file ({errors.first_line(e)})"
    ) from None


def latest(directory: str) -> str:
  """The prefix the directory's `checkpoint` file names as the latest."""
  state = checkpoint_state(directory)
  if state is None or not state.model_checkpoint_path:
    raise errors.ConversionError(
        directory, "no checkpoint in this directory (no 'checkpoint' file "
        "naming one); give a checkpoint prefix.")
  return os.path.join(directory, state.model_checkpoint_path)


def _reason(message: str) -> str:
  """TensorFlow's reason without the file name and advice around it:
  "Unable to open table file F: DATA_LOSS: not an sstable (bad magic
  number): perhaps ..." -> "not an sstable (bad magic number)"."""
  return message.split(": perhaps")[0].rsplit(": ", 1)[-1]


class RowReader:
  """Row blocks of the variables of one (TF1 or TF2) checkpoint."""

  def __init__(self, prefix: str):
    self.prefix = prefix
    try:
      reader = tf.train.load_checkpoint(prefix)
    except tf.errors.NotFoundError:
      raise errors.ConversionError(
          prefix, f"no checkpoint here (no file {prefix}.index)") from None
    except (tf.errors.OpError, ValueError) as e:
      index = prefix + ".index"
      raise errors.ConversionError(
          index if os.path.isfile(index) else prefix,
          "not a TensorFlow checkpoint "
          f"({_reason(errors.first_line(e))})") from None
    self.shapes = reader.get_variable_to_shape_map()
    self.dtypes = reader.get_variable_to_dtype_map()
    self._index = reader.debug_string()

  def slice_rows(self, name: str) -> List[int]:
    """Row counts of the slices `name` was saved in ([] if saved whole)."""
    pattern = re.compile(
        rb"(?:\A|\n)\x00" + re.escape(name.encode()) +
        rb"\x00.*? \(DT_\w+\) \[(\d+)", re.S)
    return [int(m.group(1)) for m in pattern.finditer(self._index)]

  def check_table(self, name: str, shape: Optional[List[int]] = None):
    """Raises ValueError unless `name` is a float32 matrix (of `shape`)."""
    if name not in self.shapes:
      raise ValueError(f"Variable {name!r} is not in checkpoint "
                       f"{self.prefix}.")
    if self.dtypes[name] != tf.float32 or len(self.shapes[name]) != 2:
      raise ValueError(
          f"Variable {name!r} is {self.dtypes[name].name} of shape "
          f"{self.shapes[name]}; an embedding table or slot is a float32 "
          "matrix.")
    if min(self.shapes[name]) < 1:
      raise ValueError(
          f"Variable {name!r} has shape {self.shapes[name]}; an embedding "
          "table has at least one row and one column.")
    if shape is not None and self.shapes[name] != list(shape):
      raise ValueError(f"Slot variable {name!r} has shape "
                       f"{self.shapes[name]}, its table {list(shape)}.")

  def read_rows(self, name: str, start: int, count: int) -> np.ndarray:
    """Checkpoint rows `[start, start + count)` of `name`."""
    rows, dim = self.shapes[name]
    spec = f"{rows} {dim} {start},{count}:-"
    try:
      return tf.raw_ops.RestoreV2(prefix=self.prefix, tensor_names=[name],
                                  shape_and_slices=[spec],
                                  dtypes=[tf.float32])[0].numpy()
    except tf.errors.OpError as e:
      raise ValueError(f"Variable {name!r}: rows [{start}, {start + count}) "
                       f"cannot be read ({errors.first_line(e)}).") from None

  def hosts(self, name: str, num_hosts: Optional[int]) -> int:
    """How many host slices a "mod" table was saved in."""
    saved = self.slice_rows(name)
    rows = self.shapes[name][0]
    if not saved:
      if num_hosts is None:
        raise ValueError(
            f"Variable {name!r} was saved whole, so its number of hosts is "
            "unknown: give num_hosts to undo the 'mod' partitioning.")
      return num_hosts
    if num_hosts is not None and num_hosts != len(saved):
      raise ValueError(f"Variable {name!r} was saved in {len(saved)} host "
                       f"slices, not num_hosts={num_hosts}.")
    if saved != _partition_sizes(rows, len(saved)):
      raise ValueError(
          f"Variable {name!r} was saved in slices of {saved} rows, not "
          "TPUEstimator's per-host partitioning; cannot undo 'mod'.")
    return len(saved)

  def blocks(self, name: str, block_rows: int, strategy: str = "div",
             hosts: int = 1) -> Iterator[Tuple[int, np.ndarray]]:
    """Yields `(first id, rows)` for ids `[0, rows)` in blocks."""
    total = self.shapes[name][0]
    offsets = np.cumsum([0] + _partition_sizes(total, hosts))
    for start in range(0, total, block_rows):
      stop = min(start + block_rows, total)
      if strategy == "div":
        yield start, self.read_rows(name, start, stop - start)
        continue
      out = np.empty([stop - start, self.shapes[name][1]], np.float32)
      filled = 0
      for p in range(hosts):
        first, last = -(-(start - p) // hosts), -(-(stop - p) // hosts)
        first = max(first, 0)
        if last > first:
          rows = self.read_rows(name, int(offsets[p]) + first, last - first)
          out[np.arange(first, last) * hosts + p - start] = rows
          filled += last - first
      if filled != stop - start:  # never hand on rows nobody wrote
        raise ValueError(f"Variable {name!r}: ids [{start}, {stop}) are not "
                         f"all in its {hosts} host slices.")
      yield start, out
