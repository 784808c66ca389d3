"""The SparseCore generation (`tfemb.TPUEmbeddingV2`) in SavedModels.

Its tables are stacked (`tfemb.sparsecore.table_stacking`); the host keeps
each in a variable of its own, in the SparseCore's row order with padding
(`tfemb.sparsecore.trained_config`). An inference export writes each user
table on its own, `[vocabulary_size, dim]` in id order, without the padding
rows and columns: an `UnstackedTable` reads the table's rows and columns when
the save writes them. A full save (`tf.saved_model.save` of the model)
looks the ids up in the tables' live variables at their rows.

Either way the serving function takes any batch size: a feature whose
per-replica `output_shape` has rank 1 (one activation per example) is
looked up with that shape's batch dimension free, its inputs read as
`TPUEmbeddingV2` reads them (a dense input is one id per sample, with its
own weight; sparse and ragged inputs are combined per example). A feature
whose `output_shape` has more dimensions keeps it, batch size included.
"""

import copy
from typing import Dict

import tensorflow as tf
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import variable_view
from tfemb.host import feeding
from tfemb.host.row_reads import gather_rows
from tfemb.sparsecore import combiner as combiner_lib
from tfemb.sparsecore import input_rules


def is_stacked(engine) -> bool:
  """Whether `engine` is a host `TPUEmbeddingV2` (its tables stacked)."""
  from tfemb.sparsecore import engine as sparsecore_engine  # pylint: disable=g-import-not-at-top
  return isinstance(engine, sparsecore_engine.TPUEmbeddingV2)


class UnstackedTable(variable_view.SavedValue):
  """One table's parameters in its own variable: the source of its
  `tfemb.serving.export.ServingTable`, read (only this table's rows and columns)
  when the save writes it (`saved_value`)."""

  def __init__(self, variable: tf.Variable, remap, dim: int):
    self._variable = variable
    self._remap = remap
    self.shape = tf.TensorShape([remap.vocabulary_size, dim])
    self.dtype = variable.dtype
    self.device = variable.device

  def saved_value(self) -> tf.Tensor:
    ids = tf.range(self._remap.vocabulary_size, dtype=tf.int64)
    rows = gather_rows(self._variable, self._remap.rows_of(ids))
    dim = self.shape[1]
    return rows if rows.shape[1] == dim else rows[:, :dim]


def _check(engine):
  config = engine.resolved_config
  for path, feature in zip(config.paths, config.features):
    if combiner_lib.is_custom(feature.table.combiner):
      raise ValueError(
          f"Feature {path!r} has a CustomCombiner, which SavedModel exports "
          "do not support yet. Save the model with a checkpoint (or "
          "model.save) and serve it where tfemb is installed, or train the "
          "feature with a 'sum', 'mean' or 'sqrtn' combiner.")


def unstacked(engine) -> Dict[str, UnstackedTable]:
  """Each user table of `engine`, by name, as an export writes it."""
  _check(engine)
  tables, remaps = stacked(engine)
  return {t.name: UnstackedTable(tables[t.name], remaps[t.name], t.dim)
          for t in engine.resolved_config.tables}


def stacked(engine):
  """`(tables, remaps)` by user table name: each table's live variable,
  and where its ids sit in it (for a full save)."""
  _check(engine)
  own = engine.own_tables()
  return ({name: variables["parameters"] for name, (variables, _) in
           own.items()}, {name: remap for name, (_, remap) in own.items()})


def _any_batch(feature) -> bool:
  return feature.output_shape.rank == 1


def serving_config(config):
  """`config` (the engine's user tables and features) with each rank-1
  `output_shape` dropped: those features serve any batch size."""
  features = []
  for feature in config.features:
    if _any_batch(feature):
      feature = copy.copy(feature)
      feature.output_shape = tf.TensorShape(None)
      feature.max_sequence_length = 0  # an output_shape made it one row
    features.append(feature)
  return config._replace(
      structure=nest.pack_sequence_as(config.structure, features),
      features=features)


def serving_inputs(config, features, weights):
  """`(features, weights)` as the host lookup takes them: dense inputs one
  id per sample (`tfemb.sparsecore.input_rules`), at any batch size where the
  feature's `output_shape` has rank 1."""
  _, flat, flat_weights = feeding.flat_inputs(config, features, weights,
                                              False)
  prepared = [input_rules.prepare(path, feature, x, w,
                                  any_batch=_any_batch(feature))
              for path, feature, x, w in zip(config.paths, config.features,
                                             flat, flat_weights)]
  ids, weights = zip(*prepared)
  if all(w is None for w in weights):
    return nest.pack_sequence_as(features, list(ids)), None
  return (nest.pack_sequence_as(features, list(ids)),
          nest.pack_sequence_as(features, list(weights)))
