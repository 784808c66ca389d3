"""The layouts a checkpoint of the host `TPUEmbeddingV2` holds, as
TensorFlow saves them (under `_sparse_core_table_layouts`): written with
the stacked variables (`LayoutsTrackable`), read back to tell a checkpoint
of another layout (`saved_layouts`, for `tfemb.sparsecore.
checkpoint_adapter`).
"""

from typing import Dict, Optional

import tensorflow as tf
from tensorflow.core.tpu.kernels import sparse_core_layout_pb2
from tensorflow.python.tpu import tpu_embedding_v3_utils  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import base as trackable  # pylint: disable=g-direct-tensorflow-import

_Layout = sparse_core_layout_pb2.SparseCoreTableLayout


class LayoutsTrackable(tpu_embedding_v3_utils.SparseCoreLayoutsTrackable):
  """TensorFlow's trackable of the layouts, its tensor made as it is saved
  (a SavedModel traces its saver into a graph, which cannot capture the
  eager constant)."""

  def __init__(self, serialized: bytes):
    super().__init__(tf.constant(serialized))
    self._serialized = serialized

  def _serialize_to_tensors(self):
    return {trackable.VARIABLE_VALUE_KEY: tf.constant(self._serialized)}


def saved_layouts(path: str) -> Optional[Dict[str, _Layout]]:
  """The layouts a checkpoint was saved with, by table; None for a
  checkpoint of unstacked tables."""
  reader = tf.train.load_checkpoint(path)
  for key in reader.get_variable_to_dtype_map():
    if tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY in key:
      layouts = sparse_core_layout_pb2.SparseCoreTableLayouts()
      layouts.ParseFromString(reader.get_tensor(key))
      return {l.table_name: l for l in layouts.tables}
  return None
