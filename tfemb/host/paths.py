"""A table's path: the interface a step (`tfemb.host.step`) runs every
table through.

The host engine's paths (`tfemb.host.table_paths`: `FusedTable`, `OpsTable`)
and those built on them above the host engine (`TPUEmbeddingV2`'s
`CustomTable` for a `CustomOptimizer`, the serving lookup's path in
`tfemb.export`) derive from `TablePath`; the step takes nothing else.
"""

import abc
from typing import (Any, Callable, Hashable, List, NamedTuple, Optional,
                    Sequence, Tuple, Union)

import tensorflow as tf

from tfemb import inputs


class Member(NamedTuple):
  """One feature of a table in a batch."""
  index: int  # the feature's flat index
  path: str
  feature: Any  # its FeatureConfig
  lookup: inputs.Lookup


class Pending(NamedTuple):
  """A table's update, computed but not written."""
  finite: tf.Tensor  # every new value of the table and its slots is finite
  write: Callable[[], Any]  # writes it


class InPlace(NamedTuple):
  """A table's update written in place as it was computed (the fused
  kernels: each update computed once), where every new value of the table
  and its slots is finite; else nothing changed."""
  finite: tf.Tensor  # the update was finite, and written
  restore: Callable[[tf.Tensor], Any]  # restore(keep): taken back unless keep


class ShardUpdate(NamedTuple):
  """One shard's part of a table's update, run under that shard's own lock
  on the parameter server holding it (`TablePath.shard_updates`)."""
  table: str  # the table's name
  shard: int  # which of its shards
  shards: int  # of how many
  device: str  # the shard's parameter server
  apply: Callable[[], tf.Tensor]  # reads, updates, checks and writes the
  # shard's rows (nothing where a new value is not finite): whether finite


class PerIdGradients(NamedTuple):
  """A table's gradients left for `TablePath.update_together` to sum: one
  row per id looked up, and where each sits among the distinct ids."""
  rows: Any  # [ids looked up, dim], or a list of pieces of those rows
  positions: tf.Tensor  # [ids looked up], into the batch's `unique_ids`


class TablePath(abc.ABC):
  """One table's share of a step, on the path chosen for the table once.

  `table` is the table's (resolved) `TableConfig`. A path's batch (what
  `lookup` returns) has `features`, the member features' flat indices, and
  `unique_ids`, the table's distinct ids (or rows) in the batch; the rest
  is the path's own.
  """

  table: Any

  @abc.abstractmethod
  def lookup(self, members: Sequence[Member]) -> Tuple[Any, List[Any]]:
    """`(batch, checks)`: the table's distinct ids, where each id of each
    member feature sits among them, and the rows; `checks` are the input
    checks every update of the step must wait for."""

  @abc.abstractmethod
  def feature_rows(self, batch) -> List[tf.Tensor]:
    """Each member feature's rows, one per id (simulated quantization
    applied)."""

  @abc.abstractmethod
  def row_gradients(self, batch, entry_grads: Sequence[tf.Tensor],
                    raising: bool) -> Tuple[tf.Tensor, tf.Tensor]:
    """`(grads, finite)`: the gradient summed per distinct id. With
    `raising`, `grads` carries the non-finite check (an error naming the
    table) and `finite` is True; otherwise `finite` says whether every
    value is finite."""

  def stage(self, ids: tf.Tensor, grads: tf.Tensor) -> Any:
    """What `prepare` will take of rows `ids` and their summed gradients
    `grads`, made ready before the step takes its lock (e.g. split by
    shard and sent to the parameter servers that will compute the update);
    `prepare` gets it as `staged`. None by default."""
    del ids, grads
    return None

  def updates_per_shard(self) -> bool:
    """Whether the table's update is `shard_updates`, each shard's under
    its own lock on its parameter server, instead of `stage` and
    `prepare` under the step's lock."""
    return False

  def shard_updates(self, ids: tf.Tensor, grads: tf.Tensor,
                    lr: tf.Tensor) -> List[ShardUpdate]:
    """The update of rows `ids` by their summed gradients `grads`, split by
    shard and sent to the shards' parameter servers (called once every
    check of the step has passed: nothing is sent before). Only for paths
    that `updates_per_shard`."""
    raise NotImplementedError(f"{type(self).__name__} updates its table "
                              "under the step's lock")

  def updates_in_place(self) -> bool:
    """Whether `prepare` returns an `InPlace` here: the step then calls it
    after every other update of the step is computed (a failing assert in
    theirs stops the step before this one writes)."""
    return False

  def together_key(self) -> Optional[Hashable]:
    """Where not None, the step's update may be one `update_together` of
    every table, when every table's path gives an equal key here; else
    each table's update is `prepare`d under the step's lock."""
    return None

  def per_id_gradients(self, batch, entry_grads: Sequence[tf.Tensor]
                       ) -> PerIdGradients:
    """The table's gradients unsummed, for an `update_together` that sums
    them itself (one replica: the sums need no exchange first). Only for
    paths that give a `together_key`."""
    raise NotImplementedError(f"{type(self).__name__} sums its gradients "
                              "in row_gradients")

  @classmethod
  def update_together(cls, paths: Sequence["TablePath"],
                      ids: Sequence[tf.Tensor],
                      grads: Sequence[Union[tf.Tensor, PerIdGradients]],
                      lrs: Sequence[tf.Tensor], gradients_finite: tf.Tensor,
                      raising: bool = False) -> List[tf.Tensor]:
    """Every table's update (by table, as in `prepare`) in one op that is
    all or nothing by itself, needing no lock: each table's new rows and
    slots written where all are finite, else none (and, unless
    `gradients_finite`, nothing computed). Returns each table's
    finiteness. `grads`: each table's summed gradients (`row_gradients`),
    or all of them `per_id_gradients`, which the op sums first; a table
    whose sum is not finite is then not finite either, and with `raising`
    the op fails naming it, writing nothing. Only for paths that give a
    `together_key`."""
    raise NotImplementedError(f"{cls.__name__} updates its tables one by one")

  @abc.abstractmethod
  def prepare(self, batch, ids: tf.Tensor, grads: tf.Tensor, lr: tf.Tensor,
              global_batch: bool, staged: Any = None
              ) -> Union[Pending, InPlace]:
    """The table's optimizer on rows `ids` with learning rate `lr`
    (`global_batch`: the ids are the global batch's, not this batch's),
    computed from the rows as they are now (under the step's lock,
    `non_finite.NonFinitePolicy.serialized`): a `Pending`, whether the new rows
    and slots are finite and the function that writes them, writing
    nothing; or, where `updates_in_place`, an `InPlace`, written already
    where finite, which the step takes back if another of its updates is
    not. `staged` is what `stage` returned for `ids` and `grads`."""
