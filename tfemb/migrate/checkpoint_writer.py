"""Writes a `tf.train.Checkpoint` of embedding tables, block by block.

Each block of rows goes to its own shard (`SaveV2` of row slices); `finish`
adds the object graph and merges the shards (`MergeV2Checkpoints`) into one
checkpoint whose keys are those `tf.train.Checkpoint(**{root: embedding})`
saves for a `tfemb.TPUEmbedding` (and TensorFlow's `TPUEmbedding`): the
table `<root>/<table>/.ATTRIBUTES/VARIABLE_VALUE` and each slot
`<root>/<table>/<slot>` (local names escaped as TensorFlow escapes them).
Only one block is in memory at a time.

Nothing appears at the output prefix before `finish`: the shards and the
merged checkpoint are written under `<prefix>.partial/`, and `finish`
moves the data files, then the index (the file that makes a checkpoint),
into place. A failure before then (or `abort`) leaves no output, and a
checkpoint being replaced as it was; the old one's index goes first, so
no step of the swap leaves an index over data files not its own.
"""

import glob
import os
import shutil
from typing import List, Sequence, Set

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2
from tensorflow.python.checkpoint import checkpoint_management
from tensorflow.python.trackable import trackable_utils

from tfemb.migrate import errors
from tfemb.migrate import row_reader

_VALUE = "VARIABLE_VALUE"
_SAVE_COUNTER = "save_counter"


def _key(path: Sequence[str]) -> str:
  escaped = "/".join(trackable_utils.escape_local_name(p) for p in path)
  return trackable_utils.checkpoint_key(escaped, _VALUE)


class CheckpointWriter:
  """Streams embedding variables into a new object-based checkpoint.

  Args:
    output_prefix: the checkpoint to write (`<prefix>.index`, ...).
    root: the path from the `tf.train.Checkpoint` to the embedding object,
      e.g. "embedding" for `tf.train.Checkpoint(embedding=...)`, or
      "model/embedding" for an attribute of an attribute.
  """

  def __init__(self, output_prefix: str, root: str = "embedding"):
    self.output_prefix = output_prefix
    self._root = [p for p in root.split("/") if p]
    if not self._root:
      raise ValueError(f"root must name the embedding object, got {root!r}.")
    self._shard_dir = output_prefix + ".partial"
    shutil.rmtree(self._shard_dir, ignore_errors=True)
    os.makedirs(self._shard_dir)
    self._shards: List[str] = []
    self._variables: Set[str] = set()  # local names

  def key(self, local_name: str) -> str:
    """The checkpoint key of a variable of the embedding object."""
    return _key(self._root + [local_name])

  def write_rows(self, local_name: str, shape: Sequence[int], start: int,
                 rows: Sequence[np.ndarray], more_names: Sequence[str] = ()):
    """Writes rows `[start, start + len)` of one or more variables.

    `rows[0]` belongs to `local_name`, `rows[i]` to `more_names[i - 1]`; all
    have `shape` (the full variable shape).
    """
    names = [local_name] + list(more_names)
    self._variables.update(names)
    count = rows[0].shape[0]
    spec = f"{shape[0]} {shape[1]} {start},{count}:-"
    shard = os.path.join(self._shard_dir, f"shard-{len(self._shards)}")
    tf.raw_ops.SaveV2(prefix=shard, tensor_names=[self.key(n) for n in names],
                      shape_and_slices=[spec] * len(names),
                      tensors=[np.asarray(r, np.float32) for r in rows])
    self._shards.append(shard)

  def _object_graph(self) -> bytes:
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.nodes.add()  # The tf.train.Checkpoint.

    def add_child(parent_id, local_name):
      graph.nodes[parent_id].children.add(node_id=len(graph.nodes),
                                          local_name=local_name)
      return graph.nodes.add()

    def add_variable(parent_id, local_name, key):
      add_child(parent_id, local_name).attributes.add(
          name=_VALUE, full_name=local_name, checkpoint_key=key)

    embedding_id = 0
    for name in self._root:
      add_child(embedding_id, name)
      embedding_id = len(graph.nodes) - 1
    for name in sorted(self._variables):
      add_variable(embedding_id, name, self.key(name))
    add_variable(0, _SAVE_COUNTER, _key([_SAVE_COUNTER]))
    for node in graph.nodes:
      node.has_checkpoint_values.value = True
    return graph.SerializeToString()

  def finish(self) -> bool:
    """Merges everything into `output_prefix`. Returns whether the
    directory's `checkpoint` file now names it (`record_latest`)."""
    shard = os.path.join(self._shard_dir, "object-graph")
    tf.raw_ops.SaveV2(
        prefix=shard,
        tensor_names=["_CHECKPOINTABLE_OBJECT_GRAPH", _key([_SAVE_COUNTER])],
        shape_and_slices=["", ""],
        tensors=[tf.constant(self._object_graph()), tf.constant(1, tf.int64)])
    self._shards.append(shard)
    merged = os.path.join(self._shard_dir, "merged")
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=self._shards,
                                  destination_prefix=merged,
                                  delete_old_dirs=False)
    data = sorted(glob.glob(glob.escape(merged) + ".data-*"))
    old = set(glob.glob(glob.escape(self.output_prefix) + ".data-*"))
    if os.path.exists(self.output_prefix + ".index"):
      # Gone first: never an old index over new data files.
      os.remove(self.output_prefix + ".index")
    for name in data:
      os.replace(name, self.output_prefix + name[len(merged):])
    os.replace(merged + ".index", self.output_prefix + ".index")
    for name in old - {self.output_prefix + n[len(merged):] for n in data}:
      os.remove(name)  # a replaced checkpoint's other shards
    self.abort()
    return record_latest(self.output_prefix)

  def abort(self):
    """Removes the shards written so far."""
    shutil.rmtree(self._shard_dir, ignore_errors=True)


def record_latest(prefix: str) -> bool:
  """Names `prefix` in its directory's `checkpoint` file (so that
  `tf.train.latest_checkpoint(directory)` finds it) when the directory has
  none, or one that names it already. A `checkpoint` file that names
  another checkpoint (e.g. a TPUEstimator's model_dir) is never rewritten;
  returns False then."""
  path = os.path.abspath(prefix)
  directory = os.path.dirname(path)
  try:
    state = row_reader.checkpoint_state(directory)
  except errors.ConversionError:
    return False  # not ours to repair
  if state is not None and os.path.abspath(os.path.join(
      directory, state.model_checkpoint_path)) != path:
    return False
  checkpoint_management.update_checkpoint_state_internal(
      directory, path, all_model_checkpoint_paths=[path],
      save_relative_paths=True)
  return True
