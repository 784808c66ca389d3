"""The host `TPUEmbeddingV2` under its `SparseCoreEmbeddingConfig`'s id
limits: each replica's batch (one chip's) is counted as the SparseCore
counts it, by TensorFlow ops in the step (`tfemb.sparsecore.id_limit_ops`,
the numbers of `tfemb.sparsecore.id_counting`); a batch the TPU would fail
raises before anything is written, and with `allow_id_dropping` the ids the
TPU would drop are not looked up or trained (docs/sparsecore.md, "Id
limits").

The ids dropped so far are counted in a variable of the host's, which each
replica adds its own drops to, untracked (a checkpoint keeps its keys);
a warning gives the totals at most once a minute, by `tf.print` to the
log under a `tf.cond` on the time of the last one.
"""

from typing import Any, Dict, Sequence

from absl import logging
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import

from tfemb import validation
from tfemb.sparsecore import id_counting
from tfemb.sparsecore import id_limit_ops

_LOG_EVERY_S = 60.0


def _host_variable(value, name: str):
  """A variable of this process, on its CPU, made outside any strategy (in
  a strategy's scope a `tf.Variable` would be a mirrored one: this one is
  the worker's, and each of its replicas adds to it) and eagerly, even
  from a trace."""
  with tf.init_scope(), tf.device("/device:CPU:0"):
    return resource_variable_ops.ResourceVariable(
        value, trainable=False, name=name)


class IdLimits:
  """Checks, and where allowed drops, each batch's ids.

  Args:
    stacking: the engine's `table_stacking.Stacking`.
    config: the engine's resolved configuration (`tfemb.resolution`).
    sparse_core_embedding_config: the user's config.
  """

  def __init__(self, stacking, config, sparse_core_embedding_config):
    cores = stacking.num_sc_per_chip
    features = []
    for path, feature in zip(config.paths, config.features):
      samples = tf.TensorShape(feature.output_shape).num_elements()
      if samples % cores:
        raise ValueError(
            f"Feature {path!r}: its {samples} samples (output_shape's size) "
            f"do not divide among the {cores} SparseCores of a chip, as a "
            "SparseCore TPU needs.")
      features.append((validation.feature(path, feature.table.name),
                       feature.table.name, samples))
    self._ops = id_limit_ops.IdLimitOps(
        stacking, features,
        id_counting.Limits.of(sparse_core_embedding_config))
    self._dropping = sparse_core_embedding_config.allow_id_dropping
    self._dropped = self._logged_at = None
    if self._dropping:
      self._dropped = _host_variable(
          tf.zeros([len(self._ops.names)], tf.int64), "dropped_ids")
      self._logged_at = _host_variable(
          tf.constant(float("-inf"), tf.float64), "dropped_ids_logged_at")

  @property
  def dropped_ids(self) -> Dict[str, int]:
    """Ids dropped so far, per stacked table (all replicas)."""
    if self._dropped is None:
      return {name: 0 for name in self._ops.names}
    with tf.init_scope():
      counts = self._dropped.numpy()
    return {name: int(c) for name, c in zip(self._ops.names, counts)}

  def _count(self, dropped: tf.Tensor) -> list:
    """Adds a step's drops, and logs the totals if the last warning is a
    minute old."""
    total = self._dropped.assign_add(dropped)
    now = tf.timestamp()

    def warn():
      pieces = []
      for k, name in enumerate(self._ops.names):
        pieces += [", " if k else "", f"{name!r}: ", total[k]]
      with tf.control_dependencies([self._logged_at.assign(now)]):
        tf.print(
            "The SparseCore drops ids over max_ids_per_chip_per_sample "
            "(allow_id_dropping=True); dropped so far, per stacked table: {",
            *pieces, "}. See TPUEmbeddingV2.dropped_ids.", sep="",
            output_stream=logging.warning)
        return tf.constant(True)

    due = now - self._logged_at > _LOG_EVERY_S
    if tf.executing_eagerly():
      return [warn()] if bool(due) else []
    return [tf.cond(due, warn, lambda: tf.constant(False))]

  def apply(self, indices: Sequence[int], lookups: Sequence[Any]) -> list:
    """`lookups` (of features `indices`) without the ids the SparseCore
    drops; raises `InvalidArgumentError` for a batch it fails (eagerly,
    `id_counting.LimitError`). In a graph the check is each lookup's `gate`:
    its activations and the step's writes wait for it, its rows are read
    beside it."""
    ids = [tf.cast(lookup.ids, tf.int64) for lookup in lookups]
    samples = [None if lookup.segments is None else
               tf.cast(lookup.segments, tf.int64) for lookup in lookups]
    dropping = self._dropping and self._ops.may_overflow(indices, ids)
    payloads = []
    for lookup, x in zip(lookups, ids):
      segments = lookup.segments
      if segments is None and dropping:  # once some ids are dropped
        segments = tf.range(tf.size(x, out_type=lookup.ids.dtype))
      payloads.append([t for t in (lookup.ids, segments, lookup.scales)
                       if t is not None])
    kept, ok = self._ops.enforce(indices, ids, samples, payloads,
                                 self._count if dropping else None)
    out = []
    for lookup, tensors in zip(lookups, kept):
      tensors = iter(tensors)
      ids_ = next(tensors)
      ids_.set_shape([None] if dropping else lookup.ids.shape)
      segments = next(tensors) if (
          dropping or lookup.segments is not None) else None
      scales = None if lookup.scales is None else next(tensors)
      gate = lookup.gate if ok is None else lookup.gate + (ok.op,)
      out.append(lookup._replace(ids=ids_, segments=segments, scales=scales,
                                 gate=gate))
    return out
