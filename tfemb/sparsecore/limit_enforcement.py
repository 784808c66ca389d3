"""The host `TPUEmbeddingV2` under its `SparseCoreEmbeddingConfig`'s id
limits: each replica's batch (one chip's) is counted as the SparseCore
counts it (`tfemb.sparsecore.id_counting`); a batch the TPU would fail raises
before anything is written, and with `allow_id_dropping` the ids the TPU
would drop are not looked up or trained (docs/sparsecore.md, "Id limits").
"""

import threading
import time
from typing import Any, Dict, List, Sequence

from absl import logging
import numpy as np
import tensorflow as tf

from tfemb.sparsecore import id_counting

_LOG_EVERY_S = 60.0


class IdLimits:
  """Checks, and where allowed drops, each batch's ids.

  Args:
    stacking: the engine's `table_stacking.Stacking`.
    config: the engine's resolved configuration (`tfemb.resolution`).
    sparse_core_embedding_config: the user's config.
  """

  def __init__(self, stacking, config, sparse_core_embedding_config):
    cores = stacking.num_sc_per_chip
    for path, feature in zip(config.paths, config.features):
      samples = tf.TensorShape(feature.output_shape).num_elements()
      if samples % cores:
        raise ValueError(
            f"Feature {path!r}: its {samples} samples (output_shape's size) "
            f"do not divide among the {cores} SparseCores of a chip, as a "
            "SparseCore TPU needs.")
    self._stacking = stacking
    self._config = config
    self._limits = id_counting.Limits.of(sparse_core_embedding_config)
    self._lock = threading.Lock()
    self._dropped = {name: 0 for name in stacking.stacked_tables}
    self._logged_at = None

  @property
  def dropped_ids(self) -> Dict[str, int]:
    """Ids dropped so far, per stacked table (all replicas)."""
    with self._lock:
      return dict(self._dropped)

  def _plan(self, indices: Sequence[int], *arrays) -> List[np.ndarray]:
    features = []
    for k, i in enumerate(indices):
      feature = self._config.features[i]
      features.append(id_counting.FeatureIds(
          self._config.paths[i], feature.table.name, arrays[2 * k],
          arrays[2 * k + 1],
          tf.TensorShape(feature.output_shape).num_elements()))
    plan = id_counting.plan(self._stacking, features, self._limits)
    self._count(plan.dropped)
    return plan.kept

  def _count(self, dropped: Dict[str, int]) -> None:
    with self._lock:
      for name, count in dropped.items():
        self._dropped[name] += count
      now = time.monotonic()
      if any(dropped.values()) and (
          self._logged_at is None or now - self._logged_at > _LOG_EVERY_S):
        self._logged_at = now
        logging.warning(
            "The SparseCore drops ids over max_ids_per_chip_per_sample "
            "(allow_id_dropping=True); dropped so far, per stacked table: "
            "%s. See TPUEmbeddingV2.dropped_ids.",
            {n: c for n, c in self._dropped.items() if c})

  def apply(self, indices: Sequence[int], lookups: Sequence[Any]) -> list:
    """`lookups` (of features `indices`) without the ids the SparseCore
    drops; raises `InvalidArgumentError` for a batch it fails."""
    arrays = []
    for lookup in lookups:
      samples = lookup.segments
      if samples is None:  # id k is sample k
        samples = tf.range(tf.size(lookup.ids, out_type=tf.int64))
      arrays += [lookup.ids, tf.cast(samples, tf.int64)]
    masks = tf.numpy_function(
        lambda *a: self._plan(indices, *a), arrays,
        [tf.bool] * len(lookups), stateful=True)
    if not isinstance(masks, (list, tuple)):  # one feature: one tensor
      masks = [masks]
    out = []
    for lookup, mask in zip(lookups, masks):
      mask.set_shape(lookup.ids.shape)
      segments = lookup.segments
      if segments is None:
        segments = tf.range(tf.size(lookup.ids, out_type=tf.int64))
      scales = lookup.scales
      if scales is None:
        scales = tf.ones(tf.shape(lookup.ids), tf.float32)
      out.append(lookup._replace(
          ids=tf.boolean_mask(lookup.ids, mask),
          segments=tf.boolean_mask(segments, mask),
          scales=tf.boolean_mask(scales, mask)))
    return out
