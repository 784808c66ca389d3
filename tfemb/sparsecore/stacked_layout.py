"""The SparseCore's stacked layout, as the piece the engine core takes.

`TPUEmbeddingV2`'s tables are stacked as TensorFlow stacks them (its
layout stacker, `tfemb.sparsecore.table_stacking`): each table is trained in its
own variable of TensorFlow's padded shape, each id at the row the
SparseCore keeps it in, and a checkpoint holds stacked views over them
(`tfemb.sparsecore.stacked_variable`) under TensorFlow's names. This
`TableLayout` gives `tfemb.host.core.EngineCore` those variables and each
table's path (`CustomOptimizer`s included: `tfemb.sparsecore.custom_table`).
"""

from typing import Any, Dict, List

import tensorflow as tf

from tfemb import resolution
from tfemb.host import core
from tfemb.host import table_paths
from tfemb.sparsecore import custom_table
from tfemb.sparsecore import stacked_variables
from tfemb.sparsecore import table_stacking
from tfemb.sparsecore import trained_config
from tfemb import tpu_strategies

_DEFAULT_SC_PER_CHIP = 4  # TensorFlow's, when the hardware does not say


def sparse_cores_per_chip(strategy) -> int:
  """As `TPUEmbeddingV2` reads it: the TPU's
  `num_embedding_devices_per_chip` under a TPU strategy (a host one here),
  4 where that is 0 or there is no TPU."""
  if tpu_strategies.is_tpu_strategy(strategy):
    feature = strategy.extended.tpu_hardware_feature
    if feature.num_embedding_devices_per_chip:
      return feature.num_embedding_devices_per_chip
  return _DEFAULT_SC_PER_CHIP


class StackedLayout(core.TableLayout):
  """The tables of `config` stacked for `num_chips` chips of
  `num_sc_per_chip` SparseCores (TensorFlow's 4 where the hardware does not
  say),
  as TensorFlow stacks them under `sparse_core_embedding_config` (None:
  its defaults).

  `stacking`: TensorFlow's stacking (`tfemb.sparsecore.table_stacking`); `views`:
  once created, `{stacked table: {"parameters": StackedVariable, slot:
  StackedVariable}}`, what a checkpoint holds.
  """

  def __init__(self, config: resolution.Resolved, num_chips: int,
               sparse_core_embedding_config=None,
               num_sc_per_chip: int = _DEFAULT_SC_PER_CHIP):
    self.stacking = table_stacking.stack(
        config.tables, list(zip(config.paths, config.features)), num_chips,
        num_sc_per_chip, sparse_core_embedding_config)
    self._stacked_tables, self._trained = trained_config.stacked_config(
        config, self.stacking)
    self._vocabulary = {t.name: t.vocabulary_size for t in config.tables}
    self._dims = {t.name: t.dim for t in config.tables}
    # What creates the tables' own variables; not tracked by the engine.
    self._holder = stacked_variables.TablesHolder()
    self._views: Dict[str, Dict[str, Any]] = {}

  @property
  def tables(self) -> List[Any]:
    """One config per stacked table, TensorFlow's padded shape."""
    return self._stacked_tables

  @property
  def step_config(self) -> resolution.Resolved:
    """One table per user table, its own variable's padded shape."""
    return self._trained

  @property
  def views(self) -> Dict[str, Dict[str, Any]]:
    return self._views

  def remap(self, table_name: str) -> table_paths.Remap:
    """Where the ids of the user's table `table_name` sit in its variable."""
    return trained_config.remap(self.stacking, table_name,
                             self._vocabulary[table_name])

  def create(self, owner, store):
    self._views, tables = stacked_variables.create(
        owner, self._holder, self.stacking, store, self._stacked_tables,
        self._trained)
    return tables

  def padded(self, flat_grads) -> List[Any]:
    """Each feature's gradient (or None), zero-padded to the dim of its
    table's variable."""
    out = []
    for grad, feature in zip(flat_grads, self._trained.features):
      extra = feature.table.dim - self._dims[feature.table.name]
      out.append(grad if grad is None or not extra else tf.pad(
          grad, [[0, 0]] * (grad.shape.rank - 1) + [[0, extra]]))
    return out

  def unpadded(self, flat) -> List[Any]:
    """Each feature's activations, without its table's padded columns."""
    return [a if a.shape[-1] == self._dims[f.table.name] else
            a[..., :self._dims[f.table.name]]
            for a, f in zip(flat, self._trained.features)]

  def training_path(self, table, variables, partitioned, options):
    return custom_table.training_path(table, variables, partitioned, options,
                                self.remap(table.name))
