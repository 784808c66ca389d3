"""`tfemb.TPUEmbeddingV2`: the SparseCore generation's API on the host.

TPUs with SparseCores (v5p, v6e) use `tf.tpu.experimental.embedding.
TPUEmbeddingV2`. Under a `TPUStrategy` this class returns TensorFlow's own;
anywhere else it is the same protocol over the engine core
(`tfemb.host.core.EngineCore`) with the SparseCore's stacked layout
(`tfemb.sparsecore.stacked_layout`), and the numbers TensorFlow 2.21 sends
to the SparseCore (docs/sparsecore.md): `(activations, preserved) =
embedding(features, weights)`, then `embedding.apply_gradients(gradients,
preserved)`. The layouts are saved with a checkpoint as TensorFlow saves
them.
"""

from typing import Any, Dict, Optional

import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3_utils  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import data_structures
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import replicas
from tfemb import resolution
from tfemb.host import core
from tfemb.host import step_guards
from tfemb.sparsecore import combiner as combiner_lib
from tfemb.sparsecore import applied_optimizer
from tfemb.sparsecore import checkpoint_layouts
from tfemb.sparsecore import enqueue as enqueue_lib
from tfemb.sparsecore.preserved import Preserved
from tfemb.sparsecore import stacked_layout
from tfemb.sparsecore import limit_enforcement
from tfemb.sparsecore import sparse_core_stats
from tfemb.tpu import delegate

_no_autograph = tf.autograph.experimental.do_not_convert


@delegate.delegated_on_tpu(delegate.make_tpu_embedding_v2,
                          delegate.EmbeddingFeature.V2)
class TPUEmbeddingV2(core.Engine,
                     tf.tpu.experimental.embedding.TPUEmbeddingV2):
  """`tf.tpu.experimental.embedding.TPUEmbeddingV2`, computed on the host.

  Args:
    feature_config: a nested structure of `FeatureConfig`s (tfemb's or
      TensorFlow's), each with a fully defined per-replica `output_shape`.
      Never changed.
    optimizer: the optimizer of tables without their own: tfemb's or
      TensorFlow's SGD, Adagrad, AdagradMomentum, Adam, FTRL, or a
      `CustomOptimizer`; None for lookups only.
    pipeline_execution_with_tensor_core: a TPU scheduling hint; kept, no
      effect on the host.
    sparse_core_embedding_config: a `SparseCoreEmbeddingConfig`; its
      `disable_table_stacking` shapes the stacking.

  The tables are laid out for `strategy.num_replicas_in_sync` chips of 4
  SparseCores each (under a host TPUStrategy, the type's SparseCores per
  chip), as TensorFlow lays them out on such a TPU; TensorFlow's
  checkpoint adapter reshards them for another number of chips.

  It is an instance of TensorFlow's class too, for code that asks
  (keras-rs' `DistributedEmbedding` does). TensorFlow's `__init__` does
  not run: it refuses any strategy but a TPU's. This one sets up the
  engine core instead, and every method a program calls is this class's
  own.
  """

  def __init__(self,
               feature_config: Any,
               optimizer: Optional[Any] = None,
               pipeline_execution_with_tensor_core: bool = False,
               sparse_core_embedding_config: Optional[Any] = None):
    config = resolution.resolve(feature_config, optimizer)
    for path, feature in zip(config.paths, config.features):
      if not feature.output_shape or not feature.output_shape.is_fully_defined():
        raise ValueError(
            f"Feature {path!r}: TPUEmbeddingV2 needs a fully defined "
            "per-replica output_shape in its FeatureConfig (e.g. "
            f"output_shape=[batch_size]); got {feature.output_shape}.")
    applied_optimizer.check_weight_decay(config.tables)
    strategy = tf.distribute.get_strategy()
    self._feature_config = config.given
    self._pipeline_execution_with_tensor_core = (
        pipeline_execution_with_tensor_core)
    self._sparse_core_embedding_config = sparse_core_embedding_config
    layout = stacked_layout.StackedLayout(
        config, strategy.num_replicas_in_sync, sparse_core_embedding_config,
        stacked_layout.sparse_cores_per_chip(strategy))
    # The core sees a `TableLayout`; the stacking, remaps and padding are
    # the stacked layout's own, read here.
    self._layout = data_structures.NoDependency(layout)
    self._core = data_structures.NoDependency(
        core.EngineCore(config, layout, strategy))
    self._table_config = layout.tables  # as TensorFlow's attribute
    self._combiners = data_structures.NoDependency(
        combiner_lib.CustomCombiners(config))
    self._id_limits = data_structures.NoDependency(
        None if sparse_core_embedding_config is None else
        limit_enforcement.IdLimits(layout.stacking, config,
                                   sparse_core_embedding_config))
    self._adapter = data_structures.NoDependency(None)

  # --- tables ---------------------------------------------------------------

  def build(self):
    """Creates the stacked tables and their slots."""

    def then(tables):
      del tables  # the core's; tracked as the stacked views only
      with self._core.strategy.scope():
        self._combiners.create(self._track_trackable)
      self._track_trackable(
          checkpoint_layouts.LayoutsTrackable(
              self._stacking.layouts_proto().SerializeToString()),
          tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY)

    self._core.build(self, then)

  # The core's: the stacking, the stacked views by stacked table, and the
  # tables' own variables by table.
  _stacking = property(lambda self: self._layout.stacking)
  _num_sc_per_chip = property(lambda self: self._stacking.num_sc_per_chip)
  _variables = property(lambda self: self._layout.views)
  _tables = property(lambda self: self._core.tables)

  @property
  def embedding_tables(self) -> Dict[str, Any]:
    """The stacked tables (`StackedVariable`s), by stacked table name
    (TensorFlow's keys)."""
    self._maybe_build()
    return {name: v["parameters"] for name, v in self._variables.items()}

  @property
  def variables(self) -> Dict[str, Dict[str, Any]]:
    """`{stacked table name: {"parameters": .., slot: ..}}`."""
    self._maybe_build()
    return {name: dict(v) for name, v in self._variables.items()}

  def own_tables(self) -> Dict[str, Any]:
    """`{user table name: (its own variables, where its ids sit in them)}`."""
    self._maybe_build()
    return {t.name: (dict(self._tables[t.name]),
                     self._layout.remap(t.name))
            for t in self._core.config.tables}

  @property
  def embedding_layouts(self) -> Dict[str, Any]:
    """Per table, its `SparseCoreTableLayout` (TensorFlow's)."""
    return self._stacking.embedding_layouts()

  def _checkpoint_adapter(self, path):
    """Refuses, before anything of it is restored or deferred, a
    checkpoint this object cannot restore whole (a restore is all or
    nothing); returns what rearranges a checkpoint of unstacked tables or
    of another layout into the stacked variables as they are created
    (`tfemb.sparsecore.checkpoint_adapter`), None for one of this layout."""
    # TensorFlow's checkpoint adapters (2.17 on) call this; older ones never.
    from tfemb.sparsecore import checkpoint_adapter  # pylint: disable=g-import-not-at-top
    self._adapter = checkpoint_adapter.checked_adapter(
        path, self._stacking, self._core.store, self._table_config,
        self._core.config.tables, self._core.built)
    return self._adapter

  def _check_checkpoint_child(self, name):
    if (name == tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY or
        name.endswith("/" + combiner_lib.SLOT)):
      return
    if self._adapter is not None:
      self._adapter.check_child(name)
    else:
      self._core.store.check_checkpoint_child(name)

  # --- the protocol ---------------------------------------------------------

  @_no_autograph
  def __call__(self, features: Any, weights: Optional[Any] = None):
    """`embedding_lookup`: `(activations, preserved_outputs)`."""
    return self.embedding_lookup(features, weights)

  @_no_autograph
  def embedding_lookup(self, features: Any, weights: Optional[Any] = None):
    """Looks a training batch up: `(activations, preserved_outputs)`, the
    activations shaped `output_shape + [dim]`; pass `preserved_outputs` to
    `apply_gradients` with the activations' gradients."""
    return self.dequeue(self.enqueue(features, weights))

  @_no_autograph
  def enqueue(self, features: Any, weights: Optional[Any] = None,
              device: Optional[str] = None) -> Preserved:
    """Checks and deduplicates a batch; returns what `dequeue` takes."""
    if device is not None and not replicas.is_tpu_device(device,
                                                        self._core.strategy):
      raise ValueError("Non-TPU device {} passed to enqueue.".format(device))
    step_guards.refuse_xla("TPUEmbeddingV2's lookup")
    # One host: every replica's batch is looked up where it runs.
    self._maybe_build()
    with self._core.reading_inputs():
      feature_ids, lookups, kept = enqueue_lib.lookups(
          self._core.config, features, weights, self._core.output_shapes,
          self._combiners, self._id_limits,
          global_part=self._core.looks_up_globally())
      batch = self._core.gather(feature_ids, lookups)
    trained = self._layout.step_config.tables
    tables = {}
    for t, (_, table_batch) in batch.tables.items():
      tables.setdefault(trained[t].stacked_table_name, []).append(
          table_batch.unique_ids)
    return Preserved(self, kept, batch, tables)

  @_no_autograph
  def dequeue(self, partitioned_tensors: Preserved):
    """`(activations, preserved_outputs)` of an enqueued batch."""
    if not isinstance(partitioned_tensors, Preserved):
      raise ValueError("Expect the output of enqueue but get "
                       f"{type(partitioned_tensors)}.")
    partitioned_tensors.check_owner(self, "partitioned_tensors")
    batch, config = partitioned_tensors.batch, self._core.config
    shapes = self._core.output_shapes
    static = [tf.TensorShape(None) if i in self._combiners.features else s
              for i, s in enumerate(shapes)]
    flat = self._core.activations(batch, list(range(len(config.features))),
                                  static)
    flat = self._layout.unpadded(flat)
    flat, rows = self._combiners.combine(flat, partitioned_tensors.kept,
                                         shapes)
    preserved = Preserved(partitioned_tensors.owner, partitioned_tensors.kept,
                          batch, partitioned_tensors, rows, applied=[])
    return nest.pack_sequence_as(config.structure, flat), preserved

  def _copy_tensors_to_device(self, partitioned_tensors: Preserved):
    """What `apply_gradients` takes of an enqueued batch, without its
    activations (TensorFlow's step from `enqueue` to the update, which its
    tests call)."""
    return self.dequeue(partitioned_tensors)[1]

  @_no_autograph
  def apply_gradients(self, gradients: Any, preserved_outputs: Preserved):
    """Updates the rows the batch of `preserved_outputs` touched. A None
    gradient is a zero gradient (the rows are still touched)."""
    self.apply_loss_scaled_gradients(gradients, preserved_outputs, False)

  @_no_autograph
  def apply_loss_scaled_gradients(self, gradients: Any,
                                  preserved_outputs: Preserved,
                                  loss_scaled: bool = True):
    """`apply_gradients` of the gradients of a loss Keras scaled, already
    divided by its scale: a step whose gradients are not finite is skipped
    (`tfemb.host.step.apply`)."""
    if not self._core.built:
      raise RuntimeError(
          "apply_gradients called on unbuilt TPUEmbeddingV2 object. Please"
          " either call the embedding lookup method first or manually call the"
          " build method.")
    if isinstance(preserved_outputs, Preserved):  # a copy, or another's
      preserved_outputs.check_owner(self, "preserved_outputs")
    if (not isinstance(preserved_outputs, Preserved) or
        preserved_outputs.applied is None):
      raise ValueError("preserved_outputs must be the second output of the "
                       "embedding lookup (or dequeue) of this batch.")
    if preserved_outputs.applied:
      raise RuntimeError("apply_gradients was already called for this batch.")
    flat = self._core.check_gradients(gradients)
    more = self._combiners.backward(flat, preserved_outputs.kept,
                                    preserved_outputs.rows,
                                    self._core.output_shapes)
    padded = self._layout.padded(flat)
    self._core.apply(preserved_outputs.batch, padded, more, loss_scaled)
    preserved_outputs.applied.append(True)  # a refused step: not used up

  # --- the SparseCore's limits ------------------------------------------------

  @classmethod
  def compute_sparse_core_stats(cls, features: Any, feature_config: Any,
                                num_tpu_chips: int, num_sc_per_chip: int = 4,
                                optimizer: Optional[Any] = None,
                                sparse_core_embedding_config: Optional[
                                    Any] = None):
    """TensorFlow's `compute_sparse_core_stats`, on any CPU
    (`tfemb.sparsecore.sparse_core_stats`)."""
    return sparse_core_stats.compute_sparse_core_stats(
        features, feature_config, num_tpu_chips, num_sc_per_chip, optimizer,
        sparse_core_embedding_config)

  @property
  def dropped_ids(self) -> Dict[str, int]:
    """Ids dropped so far under `allow_id_dropping`, per stacked table
    (all replicas; empty without a `SparseCoreEmbeddingConfig`)."""
    return {} if self._id_limits is None else self._id_limits.dropped_ids
