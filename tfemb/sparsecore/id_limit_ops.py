"""The SparseCore's id limits as TensorFlow ops, inside the host step.

`tfemb.sparsecore.id_counting` says in NumPy what a SparseCore counts, keeps
and fails of one chip's batch (docs/sparsecore.md, "Id limits"). A host
`TPUEmbeddingV2` step under a `SparseCoreEmbeddingConfig` computes the same
here, with vectorised ops, so that no Python runs in the step:

* each id's cell, (stacked table k, SparseCore of the chip, partition), is
  one integer `(k * C + sample // (S / C)) * N + (id + rotation) mod N`;
  a sample's repeated ids (sparse and ragged inputs) count once:
  `tf.unique` on `sample * vocabulary + id` first, per feature;
* the cells' ids, and their distinct ids where a limit on those can be
  reached, by one op of the fused kernels (`TfembIdCounts`,
  `tfemb/kernels/src/id_counts.cc`: one pass over the ids, an insert per
  id into a set for the distinct ones) where they are built; otherwise
  TensorFlow's ops:
  - the cells' ids: per feature, a segment sum over (SparseCore, id mod
    N), rotated by a static gather and added into its stacked table's (a
    few ops per id, then some on `[K, C * N]`);
  - the cells' distinct ids, only in a step where a cell's ids are over
    its `max_unique_ids_per_table` (the distinct ids are never more than
    the ids): a bincount of `tf.unique` of `cell * 2^b + (the id's place
    among its stack's ids)`, per table;
* the chip's buffer: each cell's run starts at the exclusive cumsum of the
  runs before it, each padded to 8, and keeps `clip(capacity - start, 0,
  run)` of its ids; a stacked table overflows exactly where the sum of its
  padded runs is over its capacity (a multiple of 8), which static sizes
  may rule out;
* the drops, only in a step where a run does not fit: runs are kept whole
  or not at all, but the one the buffer cuts (per stacked table), whose
  ids a stable argsort of the same key lays in the SparseCore's order
  (table, id, then input order): the first ones are kept.

A batch over a limit fails with the first failure in the order
`id_counting.plan` checks and its message: `LimitError` eagerly; in a graph
an `InvalidArgumentError` from `TfembIdCounts` itself, or without the fused
kernels from `tf.debugging.Assert` (which escapes the quotes: `Stacked
table \\'t\\'`). The step's activations and writes wait for the check; its
lookups only read, beside it.
"""

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tfemb.kernels import build
from tfemb.kernels import fused_ops
from tfemb.sparsecore import id_cells
from tfemb.sparsecore import id_counting

_PAD = id_counting._PAD  # pylint: disable=protected-access


def _cond(pred, true_fn, false_fn):
  """`tf.cond` eagerly: only the branch taken runs."""
  return true_fn() if bool(pred) else false_fn()


class IdLimitOps:
  """One engine's `SparseCoreEmbeddingConfig` limits as ops.

  Args:
    stacking: the engine's `table_stacking.Stacking`.
    features: per configured feature, `(name, table name, samples)`: its
      name as errors give it; its samples are the size of its
      `output_shape`, a multiple of `num_sc_per_chip`.
    limits: `id_counting.Limits`.
  """

  def __init__(self, stacking, features: Sequence[Tuple[str, str, int]],
               limits: id_counting.Limits):
    self.cores, self.n = stacking.num_sc_per_chip, stacking.num_sparse_cores
    self.names = list(stacking.stacked_tables)
    first_id, span = {}, 1
    for stacked in stacking.stacked_tables.values():
      start = 0
      for t in sorted((stacking.tables[t] for t in stacked.table_names),
                      key=lambda t: t.row_offset):
        first_id[t.name], start = start, start + t.vocabulary_size
      span = max(span, start)
    self.bits = (span - 1).bit_length()  # an id's place < 2^bits
    self._cells = len(self.names) * self.cores * self.n
    if self._cells << self.bits >= 2**62:
      raise ValueError(
          f"The SparseCore's id limits cannot be counted on the host for "
          f"{self._cells} (stacked table, SparseCore, partition) cells of up "
          f"to {span} ids each: their keys exceed 62 bits.")
    self.narrow = self._cells << self.bits < 2**31  # int32 keys
    self._features, self._labels = [], []
    for label, table_name, samples in features:
      t = stacking.tables[table_name]
      self._features.append(id_cells.Feature(
          self.names.index(t.stacked_table_name), t.vocabulary_size,
          t.rotation, samples, samples // self.cores, first_id[table_name]))
      self._labels.append(label)
    self._limits = limits
    self._max_ids = np.array([limits.max_ids(s) for s in self.names])
    self._max_unique = np.array([limits.max_unique_ids(s)
                                 for s in self.names])
    # The distinct ids are over max_unique_ids only once the ids are.
    self._unique_reachable = bool(np.any(self._max_unique < self._max_ids))
    # TfembIdCounts where the kernels are built and its (sample, id) keys
    # fit in 62 bits.
    self._fused = build.load() is not None and all(
        f.samples * f.vocabulary < 2**62 for f in self._features)
    self._samples = [s.sample_count for s in stacking.stacked_tables.values()]
    self._capacity = np.array(
        [limits.max_ids_per_chip_per_sample * (s // self.cores) * self.cores
         for s in self._samples], np.int64)

  def may_overflow(self, indices: Sequence[int],
                   ids: Sequence[tf.Tensor]) -> bool:
    """Whether the buffer may not hold a batch of these features' ids (of
    these static sizes): each partition's run is padded by 7 at most."""
    bound = np.zeros(len(self.names), np.int64)
    for i, x in zip(indices, ids):
      if x.shape[0] is None:
        return True
      bound[self._features[i].stack] += x.shape[0]
    padding = (_PAD - 1) * np.minimum(bound, self.cores * self.n)
    return bool(np.any(bound + padding > self._capacity))

  def enforce(self, indices: Sequence[int], ids: Sequence[tf.Tensor],
              samples: Sequence[Optional[tf.Tensor]],
              payloads: Sequence[Sequence[tf.Tensor]],
              on_drop: Optional[Callable[[tf.Tensor], list]] = None
             ) -> Tuple[List[List[tf.Tensor]], Optional[tf.Tensor]]:
    """Checks one chip's batch and keeps what the SparseCore keeps.

    Args:
      indices: the configured features given (none has a CustomCombiner).
      ids: per feature, its ids (int64 `[n]`).
      samples: per feature, each id's sample (int64 `[n]`), or None: id k
        is sample k.
      payloads: per feature, tensors of its ids (`[n, ...]`, e.g. the ids,
        their samples and scales), returned with the kept ids' rows only.
      on_drop: called, in the step, where ids are dropped, with the ids
        dropped per stacked table (int64 `[K]`); returns the ops to run.

    Returns:
      `(payloads, ok)`: the payloads (where ids may be dropped, computed
      after the check; else as given); `ok`, in a graph, the check, which
      the step's activations and writes must wait for (None eagerly).

    Raises:
      id_counting.LimitError: eagerly, for a batch over a limit.
    """
    if not indices:
      # Every feature of the batch has a CustomCombiner, whose ids are not
      # counted: nothing to check (and TfembIdCounts takes one feature at
      # least), on either path.
      return [list(p) for p in payloads], None
    feats = [self._features[i] for i in indices]
    # In a graph, TfembIdCounts fails the batch itself, so the check is one
    # op: the tf.cond that words the message in TensorFlow's ops costs the
    # step more than the count (TensorFlow inlines its branches into the
    # step's graph, whose executor visits every one of their ops at every
    # step).
    checked_by_kernel = self._fused and not tf.executing_eagerly()
    if self._fused:  # the batch's cells only where ids may be dropped
      runs, unique = self._counted(indices, feats, ids, samples,
                                   checked_by_kernel)
      batch = lambda: id_cells.Batch(self, feats, ids, samples)
    else:
      cells = id_cells.Batch(self, feats, ids, samples)
      runs = self._runs(cells)
      unique = self._distinct(cells, runs)
      batch = lambda: cells
    padded = lambda: tf.bitwise.bitwise_and(runs + (_PAD - 1), -_PAD)
    overflow = self.may_overflow(indices, ids)
    # The buffer each stacked table fills: over its capacity (a multiple of
    # 8) exactly where a run does not fit.
    used = tf.reduce_sum(padded(), axis=1, keepdims=True) if overflow else None
    dropping = self._limits.allow_id_dropping and overflow
    ok = runs if checked_by_kernel else self._check(runs, unique, padded,
                                                    used, overflow)
    payloads = [list(p) for p in payloads]
    if not dropping:  # the ids as they are: lookups may read beside the check
      return payloads, ok
    with tf.control_dependencies([] if ok is None else [ok]):
      cond = _cond if ok is None else tf.cond
      return cond(tf.reduce_any(used[:, 0] > self._capacity),
                  lambda: self._dropped(batch(), runs, padded(), payloads,
                                        on_drop),
                  lambda: payloads), ok

  def _check(self, runs, unique, padded, used, overflow):
    """The check as TensorFlow's ops: None eagerly (raises `LimitError`),
    else a tensor that fails where the batch does."""
    checked = [(runs, self._max_ids)]
    if unique is not None:
      checked.append((unique, self._max_unique))
    if overflow and not self._limits.allow_id_dropping:
      checked.append((used, self._capacity))
    failed = tf.reduce_any((tf.concat([v for v, _ in checked], 1) if len(
        checked) > 1 else runs) > np.concatenate(
            [np.broadcast_to(limit[:, None], v.shape) for v, limit in checked],
            1))
    if np.any(self._capacity % _PAD):
      failed = tf.constant(True)
    message = lambda: self._message(runs, unique, padded())
    if tf.executing_eagerly():
      if bool(failed):
        raise id_counting.LimitError(message().numpy().decode())
      return None

    def fail():
      with tf.control_dependencies(
          [tf.debugging.Assert(False, [message()])]):
        return tf.constant(True)

    return tf.cond(failed, fail, lambda: tf.constant(True))

  def _counted(self, indices, feats, ids, samples, check: bool):
    """`(runs, distinct or None)` by TfembIdCounts; with `check`, it fails
    a batch over the limits."""
    limits = {}
    if check:
      limits = dict(
          limit_names=[repr(s) for s in self.names],
          max_ids=self._max_ids.tolist(), max_unique=self._max_unique.tolist(),
          stack_samples=self._samples,
          max_ids_per_chip_per_sample=(
              self._limits.max_ids_per_chip_per_sample),
          allow_id_dropping=self._limits.allow_id_dropping)
    runs, unique = fused_ops.id_counts(
        ids, samples, stacks=len(self.names),
        cores=self.cores, partitions=self.n,
        count_distinct=self._unique_reachable,
        feature_names=[self._labels[i] for i in indices],
        stack=[f.stack for f in feats],
        vocabulary=[f.vocabulary for f in feats],
        rotation=[f.rotation for f in feats],
        sizes=[f.samples for f in feats],
        first_id=[f.first_id for f in feats], **limits)
    return runs, unique if self._unique_reachable else None

  def _runs(self, batch: id_cells.Batch) -> tf.Tensor:
    """Each cell's ids `[K, C * N]`: per feature its histogram of
    (SparseCore, id mod N), rotated by its table's rotation (a static
    gather), added into its stacked table's."""
    per_stack = [[] for _ in self.names]
    p = np.arange(self.n)
    for f, counts in zip(batch.feats, batch.histograms()):
      if f.rotation:  # rotated[c, p] = counts[c, p - r]
        counts = tf.gather(counts, (np.arange(self.cores)[:, None] * self.n +
                                    (p - f.rotation) % self.n).reshape(-1))
      per_stack[f.stack].append(counts)
    return tf.stack([
        tf.add_n(c) if c else tf.zeros([self.cores * self.n], tf.int64)
        for c in per_stack])

  def _distinct(self, batch: id_cells.Batch, runs) -> Optional[tf.Tensor]:
    """Each cell's distinct (table, id) `[K, C * N]` where a count is over
    its limit (elsewhere the ids, as many or more), or None where no limit
    can be reached."""
    if not self._unique_reachable:
      return None
    cond = _cond if tf.executing_eagerly() else tf.cond

    def count():
      keys = batch.order_keys(batch.cells())
      return tf.reshape(id_cells.bincount(batch.distinct_cells(keys), self._cells),
                        tf.shape(runs))

    return cond(tf.reduce_any(runs > self._max_unique[:, None]), count,
                lambda: runs)

  def _dropped(self, batch: id_cells.Batch, runs, padded, payloads, on_drop):
    """The payloads of the ids the buffer keeps (the step's drops)."""
    starts = tf.cumsum(padded, axis=1, exclusive=True)
    kept_runs = tf.clip_by_value(self._capacity[:, None] - starts, 0, runs)
    cells = batch.cells()
    key, cells = id_cells.concat(batch.order_keys(cells)), id_cells.concat(cells)
    run = tf.gather(tf.reshape(runs, [-1]), cells)
    kept = tf.gather(tf.reshape(kept_runs, [-1]), cells)
    # A run is kept whole, or not at all, but for the one where the buffer
    # fills (per stacked table): only its ids need the SparseCore's order.
    keep = tf.equal(kept, run)
    split = tf.where((kept > 0) & ~keep)[:, 0]
    order = tf.gather(split, tf.argsort(tf.gather(key, split), stable=True))
    in_order = tf.gather(cells, order)
    place = tf.range(tf.size(order, out_type=tf.int64)) - tf.searchsorted(
        in_order, in_order, out_type=tf.int64)  # in the run
    keep = tf.tensor_scatter_nd_update(
        keep, order[:, None], place < tf.gather(kept, order))
    sizes = [tf.size(x, out_type=tf.int64) for x in batch.ids]
    keeps = tf.split(keep, tf.stack(sizes), num=len(sizes)) if len(
        sizes) > 1 else [keep]
    out = []
    for k, idx, tensors in zip(keeps, batch.dedup, payloads):
      mask = k if idx is None else tf.gather(k, idx)
      out.append([tf.boolean_mask(t, mask) for t in tensors])
    effects = on_drop(tf.reduce_sum(runs - kept_runs, axis=1)) if (
        on_drop) else []
    with tf.control_dependencies(effects):
      return [[tf.identity(t) for t in p] for p in out]

  def _message(self, runs, unique, padded) -> tf.Tensor:
    """The first failure's message, as `id_counting.plan` words it."""
    cells = runs.shape[1]
    starts = tf.cumsum(padded, axis=1, exclusive=True)
    cap_bad = tf.constant(self._capacity % _PAD != 0)[:, None]
    buffer = tf.reduce_any(starts + runs > self._capacity[:, None], axis=1,
                           keepdims=True)
    if self._limits.allow_id_dropping:
      buffer = tf.zeros_like(buffer)
    over_unique = (tf.zeros_like(runs, tf.bool) if unique is None else
                   unique > self._max_unique[:, None])
    flags = tf.concat([
        tf.reshape(tf.stack([runs > self._max_ids[:, None], over_unique],
                            -1), [len(self.names), -1]),
        cap_bad, buffer], 1)
    first = tf.argmax(tf.reshape(tf.cast(flags, tf.int32), [-1]),
                      output_type=tf.int64)
    k, r = first // (2 * cells + 2), first % (2 * cells + 2)
    cell = tf.minimum(r // 2, cells - 1)
    count = tf.gather_nd(tf.stack([
        runs, tf.zeros_like(runs) if unique is None else unique]),
                         tf.stack([r % 2, k, cell]))
    pick = lambda values: tf.gather(tf.constant(values), k)
    names = [repr(s) for s in self.names]
    part = tf.strings.as_string(cell % self.n)
    what = tf.gather(tf.constant(["ids", "unique ids"]), r % 2)
    in_cell = tf.strings.join([
        pick([f"Stacked table {s}: SparseCore " for s in names]),
        tf.strings.as_string(cell // self.n), " of the chip sends ",
        tf.strings.as_string(count), " ", what, " to partition ", part,
        " (SparseCore ", part, " of the TPU), over the limit of ",
        tf.strings.as_string(tf.gather_nd(
            np.stack([self._max_ids, self._max_unique]), tf.stack([r % 2, k]))),
        " (max_", tf.strings.regex_replace(what, " ", "_"), "_per_table[",
        pick(names), "] of the SparseCoreEmbeddingConfig; 256 when not "
        "given)."])
    capacity = pick([
        f"Stacked table {s}: max_ids_per_chip_per_sample x samples = {c} "
        f"is not a multiple of {_PAD}." for s, c in zip(names,
                                                        self._capacity)])
    total = tf.gather(tf.reduce_sum(runs, axis=1), k)
    fitting = tf.reduce_sum(tf.clip_by_value(
        tf.gather(self._capacity, k) - tf.gather(starts, k), 0,
        tf.gather(runs, k)))
    m = self._limits.max_ids_per_chip_per_sample
    full = tf.strings.join([
        pick([f"Stacked table {s}: the chip's " for s in names]),
        tf.strings.as_string(total), pick([
            f" ids do not fit in its buffer of {c} "
            f"(max_ids_per_chip_per_sample {m} x {samples} samples, each "
            f"partition's ids padded to a multiple of {_PAD}); "
            "allow_id_dropping would drop "
            for c, samples in zip(self._capacity, self._samples)]),
        tf.strings.as_string(total - fitting), " of them."])
    kind = tf.maximum(r - 2 * cells + 1, 0)  # in a cell, capacity, buffer
    return tf.gather(tf.stack([in_cell, capacity, full]), kind)
