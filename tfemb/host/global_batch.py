"""On a host TPU, the global batch looked up and updated at once, as a TPU's
embedding hardware serves every core of a chip from one memory.

Where the replicas share one copy of the tables (`TableStore.one_copy`),
each replica's lookups go to the cross-replica context (`merge_call`),
where they become one lookup per feature over the global batch (the
replicas' in their order) and one gather per table (`gather`). Each
replica holds a `Share`: the global batch and its own place in it.
`activations` computes the global batch's activations once and gives each
replica its rows; `apply` gives every replica's gradients, in the same
order, to one update of the global batch (`step.apply`, outside any
replica). The numbers are the global batch's, as with a copy per replica:
each distinct id's gradient is the sum over every replica's examples.
"""

import contextlib
from typing import Any, List, NamedTuple, Optional, Sequence

import tensorflow as tf

from tfemb import inputs
from tfemb import replicas
from tfemb import resolution
from tfemb import tf_internals
from tfemb.host import step
from tfemb.host.non_finite import NonFinitePolicy

_no_autograph = tf.autograph.experimental.do_not_convert


class _Carried:
  """A replica's Python value, handed to the cross-replica context as it is
  (`merge_call` gives the tuple of every replica's)."""

  def __init__(self, value):
    self.value = value


def _each_replica(fn, value):
  """`fn(values)` once, in the cross-replica context, with every replica's
  `value` in the replicas' order; its result returned to each replica."""

  @_no_autograph
  def merged(strategy, carried):
    return fn([c.value for c in strategy.experimental_local_results(carried)])

  return tf.distribute.get_replica_context().merge_call(
      merged, args=(_Carried(value),))


class GlobalBatch(NamedTuple):
  """Every replica's lookups (by replica, in the step's feature order) and
  the global batch they make."""
  replicas: List[List[inputs.Lookup]]
  batch: step.Batch


class Share(NamedTuple):
  """A replica's part of a global batch: the batch a step's activations
  and update are computed from, in place of a `step.Batch`."""
  whole: GlobalBatch
  replica: int

  @property
  def tables(self):
    return self.whole.batch.tables

  @property
  def lookups(self):
    return self.whole.batch.lookups


def applies() -> bool:
  """Whether a lookup here is one replica's of several (a step of a
  strategy whose replicas share the tables then looks them up at once)."""
  return replicas.in_multi_replica_step()


def reading(looks_up_globally: bool):
  """A scope for reading a replica's inputs into lookups: for the global
  batch's lookup, the host's device, where the host TPU's datasets give
  every replica's batch and the global batch is looked up; so the ids never
  go to a replica's device and back (two transfers per feature and
  replica). Else, where the step runs."""
  if looks_up_globally:
    return tf.device(tf_internals.HOST_CPU)
  return contextlib.nullcontext()


def gather(config: resolution.Resolved, paths, feature_ids: Sequence[int],
           lookups: Sequence[inputs.Lookup]) -> Share:
  """This replica's `Share` of the global batch of every replica's
  `lookups` (of `feature_ids`), looked up once, per table."""

  def look_up(every_replica):
    merged = [_merged([r[k] for r in every_replica])
              for k in range(len(feature_ids))]
    return GlobalBatch(list(every_replica),
                       step.gather(config, paths, feature_ids, merged))

  whole = _each_replica(look_up, list(lookups))
  return Share(whole, replicas.local_index())


def activations(config: resolution.Resolved, share: Share,
                feature_ids: Sequence[int], static_shapes=None) -> List[Any]:
  """This replica's activations of `feature_ids` (as `step.activations`),
  the global batch's computed once."""

  def split(every_replica):
    del every_replica  # the same structure on every replica
    rows = step.activations(config, share.whole.batch, feature_ids)
    out = [[] for _ in share.whole.replicas]
    for k, (feature, feature_rows) in enumerate(zip(feature_ids, rows)):
      dim = config.features[feature].table.dim
      own = [r[k] for r in share.whole.replicas]
      for r, (lookup, part) in enumerate(zip(own, tf.split(
          step.as_rows(feature_rows, dim), _counts(own)))):
        out[r].append(_shaped(part, lookup, dim,
                              static_shapes[feature] if static_shapes
                              else None))
    return out

  return _each_replica(split, None)[share.replica]


# Where the replicas' batches have static sizes (the usual case: a TPU
# program's per-replica batch is fixed), the merging and splitting below
# take Python sizes: a step's graph then has no op per replica and feature
# to compute one, which the executor would run at every step.


def _static_rows(lookup: inputs.Lookup) -> Optional[int]:
  """A lookup's number of output rows, if known statically."""
  if lookup.static_shape.is_fully_defined():
    return lookup.static_shape.num_elements()
  return None


def _counts(lookups: Sequence[inputs.Lookup]):
  """The lookups' output rows: Python ints if known, else a tensor."""
  static = [_static_rows(l) for l in lookups]
  if None not in static:
    return static
  return tf.stack([tf.cast(l.num_segments, tf.int64) for l in lookups])


def _shaped(rows, lookup: inputs.Lookup, dim: int, static):
  """One replica's rows, shaped as `step.activations` shapes a lookup's."""
  want = (static if static is not None else lookup.static_shape)
  if (want.rank is not None and want.is_fully_defined() and
      rows.shape == want.concatenate([dim])):
    return rows
  if lookup.static_shape.is_fully_defined():
    rows = tf.reshape(rows, lookup.static_shape.concatenate([dim]).as_list())
  else:
    rows = tf.reshape(rows, tf.concat([lookup.output_shape, [dim]], axis=0))
  static = static if static is not None else lookup.static_shape
  if static.rank is not None:
    static = static.concatenate([dim])
    if not (rows.shape.is_fully_defined() and rows.shape == static):
      rows = tf.ensure_shape(rows, static)
  return rows


def apply(config: resolution.Resolved, share: Share, flat_grads,
          policy: NonFinitePolicy, more: Sequence[step.Update] = (),
          loss_scaled: bool = False) -> None:
  """Every replica's gradients (flat, by feature, checked) to one update
  of the global batch (`step.apply`), all or nothing; `more` (the same on
  every replica: a combiner's weights, their gradient summed across
  replicas) is the first replica's."""

  def update(every_replica):
    global_grads = []
    for k, feature in enumerate(config.features):
      grads = [r[k] for r in every_replica]
      if all(g is None for g in grads):
        global_grads.append(None)
        continue
      dim = feature.table.dim
      # The replicas' pieces, not joined: the update reads them where they
      # are, or joins them where it must (`step._entry_gradients`).
      global_grads.append([
          tf.zeros([tf.cast(r[k].num_segments, tf.int32), dim], tf.float32)
          if g is None else step.as_rows(g, dim)
          for g, r in zip(grads, share.whole.replicas)])
    step.apply(config, share.whole.batch, global_grads, policy, more,
               loss_scaled)

  _each_replica(update, list(flat_grads))


def _merged(lookups: Sequence[inputs.Lookup]) -> inputs.Lookup:
  """One feature's lookups of every replica as one: their ids (int64) in
  the replicas' order, each replica's rows after the ones before."""
  if len(lookups) == 1:
    return lookups[0]._replace(ids=_cast_ids(lookups, lookups[0].ids),
                               due_cast=None)
  static = [_static_rows(l) for l in lookups]
  if None not in static:
    counts = static
    total = tf.constant(sum(static), tf.int64)
  else:
    counts = [tf.cast(l.num_segments, tf.int64) for l in lookups]
    total = tf.add_n(counts)
  segments: Optional[tf.Tensor] = None
  if any(l.segments is not None for l in lookups):
    offsets = tf.cumsum(tf.cast(tf.stack(counts), tf.int64), exclusive=True)
    segments = tf.concat([
        (l.segments if l.segments is not None else
         tf.range(tf.size(l.ids, out_type=tf.int64))) + offsets[r]
        for r, l in enumerate(lookups)], axis=0)
  scales: Optional[tf.Tensor] = None
  if any(l.scales is not None for l in lookups):
    scales = tf.concat([
        l.scales if l.scales is not None else
        tf.ones([tf.size(l.ids)], tf.float32) for l in lookups], axis=0)
  static = [l.static_shape.num_elements() for l in lookups]
  return inputs.Lookup(
      ids=_cast_ids(lookups, tf.concat([l.ids for l in lookups], axis=0)),
      segments=segments, scales=scales, num_segments=total,
      output_shape=tf.reshape(total, [1]),
      static_shape=tf.TensorShape(
          [sum(static) if None not in static else None]),
      checks=tuple(c for l in lookups for c in l.checks),
      gate=tuple(g for l in lookups for g in l.gate))


def _cast_ids(lookups: Sequence[inputs.Lookup], ids: tf.Tensor) -> tf.Tensor:
  """The replicas' `ids` joined, cast as each replica's are due and
  widened to int64 (`inputs.to_lookup`'s `global_part`): once for the
  global batch, not once per replica and feature."""
  (due,) = {l.due_cast for l in lookups}  # the same on every replica
  if due is not None:
    ids = tf.cast(ids, due)
  return tf.cast(ids, tf.int64)
