"""`tfemb.TPUEmbeddingV2`: the SparseCore generation's API on the host.

TPUs with SparseCores (v5p, v6e) use `tf.tpu.experimental.embedding.
TPUEmbeddingV2`. Under a `TPUStrategy` this class returns TensorFlow's own;
anywhere else it runs the same protocol on the host engine's parts, with
the numbers TensorFlow 2.21 sends to the SparseCore (docs/sparsecore.md):

* tables stacked as TensorFlow stacks them (`tfemb.sparsecore.table_stacking`,
  TensorFlow's own stacker): a stacked variable per stacked table, keyed
  by its name, of TensorFlow's padded shape, each id of a table at the row
  the SparseCore keeps it in, over each table's own variable, which the
  host trains (`tfemb.sparsecore.stacked_variables`); the layouts are
  saved with a checkpoint as TensorFlow saves them
  (`tfemb.sparsecore.checkpoint_layouts`);
* the rules of docs/numerics.md on the global batch's summed gradient of
  the touched rows, without gradient or weight clipping
  (`tfemb.sparsecore.applied_optimizer`), and `CustomOptimizer`s
  (`tfemb.sparsecore.custom_table`);
* `(activations, preserved) = embedding(features, weights)`, then
  `embedding.apply_gradients(gradients, preserved)`.
"""

from typing import Any, Dict, Optional

import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3_utils  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import autotrackable
from tensorflow.python.trackable import base as trackable
from tensorflow.python.trackable import data_structures
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import optimizers
from tfemb import options as options_lib
from tfemb import resolution
from tfemb import validation
from tfemb.host import core
from tfemb.host import feeding
from tfemb.host import step
from tfemb.host import variables as variables_lib
from tfemb.serving import savedmodel
from tfemb.sparsecore import applied_optimizer
from tfemb.sparsecore import checkpoint_layouts
from tfemb.sparsecore import combiner as combiner_lib
from tfemb.sparsecore import custom_table
from tfemb.sparsecore import input_rules
from tfemb.sparsecore import limit_enforcement
from tfemb.sparsecore.preserved import Preserved
from tfemb.sparsecore import sparse_core_stats
from tfemb.sparsecore import stacked_variables
from tfemb.sparsecore import table_stacking
from tfemb.sparsecore import trained_config
from tfemb.tpu import delegate

_no_autograph = tf.autograph.experimental.do_not_convert
_DEFAULT_SC_PER_CHIP = 4  # TensorFlow's, when the hardware does not say


@delegate.shows_init_arguments
class TPUEmbeddingV2(core.NonFiniteControls,
                     autotrackable.AutoTrackable):
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
  SparseCores each, as TensorFlow lays them out on such a TPU; TensorFlow's
  checkpoint adapter reshards them for another number of chips.
  """

  def __new__(cls, *args, **kwargs):
    if (args or kwargs) and delegate.is_tpu_strategy(
        tf.distribute.get_strategy()):
      return delegate.make_tpu_embedding_v2(*args, **kwargs)
    return super().__new__(cls)

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
    self._strategy = tf.distribute.get_strategy()
    self._feature_config = feature_config
    self._pipeline_execution_with_tensor_core = (
        pipeline_execution_with_tensor_core)
    self._sparse_core_embedding_config = sparse_core_embedding_config
    self._options = data_structures.NoDependency(options_lib.get())
    self._config = data_structures.NoDependency(config)
    stacking = table_stacking.stack(
        config.tables, list(zip(config.paths, config.features)),
        self._strategy.num_replicas_in_sync, _DEFAULT_SC_PER_CHIP,
        sparse_core_embedding_config)
    self._stacking = data_structures.NoDependency(stacking)
    stacked_tables, trained = trained_config.stacked_config(config, stacking)
    self._stacked = data_structures.NoDependency(trained)
    self._table_config = stacked_tables  # as TensorFlow's attribute
    self._output_shapes = [f.output_shape for f in config.features]
    self._store = data_structures.NoDependency(variables_lib.TableStore(
        stacked_tables, self._strategy, self._options))
    self._custom = [i for i, f in enumerate(config.features)
                    if combiner_lib.is_custom(f.table.combiner)]
    self._combiner_vars = data_structures.NoDependency({})
    self._id_limits = data_structures.NoDependency(
        None if sparse_core_embedding_config is None else
        limit_enforcement.IdLimits(stacking, config,
                                   sparse_core_embedding_config))
    self._policy = data_structures.NoDependency(
        step.NonFinitePolicy(self._strategy))
    self._adapter = data_structures.NoDependency(None)
    self._tables_holder = data_structures.NoDependency(  # tables' own
        stacked_variables.TablesHolder())
    self._built = False

  # --- tables ---------------------------------------------------------------

  def build(self):
    """Creates the stacked tables and their slots."""
    if self._built:
      return

    def create(*unused_strategy):
      with variables_lib.unreadable_restore_dropped(self):
        stacked, tables = stacked_variables.create(
            self, self._tables_holder, self._stacking, self._store,
            self._table_config, self._stacked)
      # Tracked as `<stacked table>` and `<stacked table>/<slot>` only.
      self._variables = data_structures.NoDependency(stacked)
      self._tables = data_structures.NoDependency(tables)
      with self._strategy.scope():
        for table in self._config.tables:
          combiner = table.combiner
          if combiner_lib.is_custom(combiner) and combiner.num_weights > 0:
            initializer = optimizers.slot_initializers(combiner)[0]
            name = f"{table.name}/{combiner_lib.SLOT}"
            self._combiner_vars[table.name] = self._track_trackable(
                tf.Variable(initializer((combiner.num_weights,), tf.float32),
                            name=name), name)
      self._track_trackable(
          checkpoint_layouts.LayoutsTrackable(
              self._stacking.layouts_proto().SerializeToString()),
          tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY)
      self._train_paths = data_structures.NoDependency([
          custom_table.training_path(t, self._tables[user.name],
                                     self._store.partitioned, self._options,
                                     trained_config.remap(
                                         self._stacking, user.name,
                                         user.vocabulary_size))
          for t, user in zip(self._stacked.tables, self._config.tables)])
      self._built = True

    core.build_once(create)

  def _named(self, i: int) -> str:
    """Feature `i` and its table, as an error names them."""
    return validation.feature(self._config.paths[i],
                              self._config.features[i].table.name)

  def _combiner_weights(self, table) -> Optional[tf.Variable]:
    """A CustomCombiner's weights (`<table>/custom_combiner_variables`)."""
    if table.combiner.num_weights == 0:
      return None
    return self._combiner_vars[table.name]

  def _maybe_build(self):
    if not self._built:
      with tf.init_scope():
        self.build()

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

  @property
  def built(self) -> bool:
    return self._built

  @property
  def resolved_config(self) -> resolution.Resolved:
    """The user's tables and features, resolved (`tfemb.resolution`)."""
    return self._config

  def own_tables(self) -> Dict[str, Any]:
    """`{user table name: (its own variables, where its ids sit in them)}`."""
    self._maybe_build()
    return {t.name: (dict(self._tables[t.name]),
                     trained_config.remap(self._stacking, t.name,
                                          t.vocabulary_size))
            for t in self._config.tables}

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
        path, self._stacking, self._store, self._table_config,
        self._config.tables, self._built)
    return self._adapter

  def _trackable_children(self, save_type=trackable.SaveType.CHECKPOINT,
                          **kwargs):
    children = super()._trackable_children(save_type, **kwargs)
    if save_type == trackable.SaveType.SAVEDMODEL and self._built:
      # What its functions read: the tables' own, not the stacked views.
      children = savedmodel.children(children, self._tables,
                                     stacked=self._variables)
    return children

  def _lookup_dependency(self, name, cached_dependencies=None):
    found = super()._lookup_dependency(name, cached_dependencies)
    if (found is None and not name.startswith("_") and
        name != tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY and
        not name.endswith("/" + combiner_lib.SLOT)):
      if self._adapter is not None:
        self._adapter.check_child(name)
      else:
        self._store.check_checkpoint_child(name)
    return found

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
    if device is not None and tf.DeviceSpec.from_string(
        device).device_type != "TPU":
      raise ValueError("Non-TPU device {} passed to enqueue.".format(device))
    # One host: every replica's batch is looked up where it runs.
    self._maybe_build()
    config = self._config
    feature_ids, _, flat_weights = feeding.flat_inputs(
        config, features, weights, False)
    flat, flat_weights = zip(*(
        input_rules.prepare(path, feature, x, w) for path, feature, x, w in zip(
            config.paths, config.features, nest.flatten(features),
            flat_weights)))
    regular = [i for i in feature_ids if i not in self._custom]
    by_feature = dict(zip(regular, feeding.lookups(
        config, regular, [flat[i] for i in regular],
        [flat_weights[i] for i in regular], False, self._output_shapes)))
    kept = {}
    for i in self._custom:  # the ids their combiner sees
      by_feature[i], kept[i] = combiner_lib.lookup(
          config.paths[i], flat[i], flat_weights[i], config.features[i],
          self._output_shapes[i].num_elements())
    if self._id_limits is not None:  # the SparseCore's limits, per chip
      by_feature.update(zip(regular, self._id_limits.apply(
          regular, [by_feature[i] for i in regular])))
    lookups = [by_feature[i] for i in feature_ids]
    batch = step.gather(self._stacked, self._train_paths, feature_ids,
                        lookups)
    preserved = Preserved(self, kept, batch)
    for t, (_, table_batch) in batch.tables.items():
      preserved.setdefault(self._stacked.tables[t].stacked_table_name,
                           []).append(table_batch.unique_ids)
    return preserved

  @_no_autograph
  def dequeue(self, partitioned_tensors: Preserved):
    """`(activations, preserved_outputs)` of an enqueued batch."""
    if not isinstance(partitioned_tensors, Preserved):
      raise ValueError("Expect the output of enqueue but get "
                       f"{type(partitioned_tensors)}.")
    partitioned_tensors.check_owner(self, "partitioned_tensors")
    batch = partitioned_tensors.batch
    n = len(self._config.features)
    static = [tf.TensorShape(None) if i in self._custom else shape
              for i, shape in enumerate(self._output_shapes)]
    flat = step.activations(self._stacked, batch, list(range(n)), static)
    flat = [a if a.shape[-1] == f.table.dim else a[..., :f.table.dim]
            for a, f in zip(flat, self._config.features)]
    rows = {}
    for i in self._custom:  # the kept ids' rows, combined per example
      rows[i] = flat[i]
      table = self._config.features[i].table
      flat[i] = tf.reshape(
          combiner_lib.combine(self._named(i), table.combiner,
                               partitioned_tensors.kept[i], rows[i],
                               self._combiner_weights(table)),
          self._output_shapes[i].concatenate([table.dim]))
    preserved = Preserved(partitioned_tensors.owner, partitioned_tensors.kept,
                          batch, partitioned_tensors, rows, applied=[])
    return nest.pack_sequence_as(self._config.structure, flat), preserved

  @_no_autograph
  def apply_gradients(self, gradients: Any, preserved_outputs: Preserved):
    """Updates the rows the batch of `preserved_outputs` touched. A None
    gradient is a zero gradient (the rows are still touched)."""
    if not self._built:
      raise RuntimeError(
          "apply_gradients called on unbuilt TPUEmbeddingV2 object. Please"
          " either call the embedding lookup method first or manually call the"
          " build method.")
    if (not isinstance(preserved_outputs, Preserved) or
        preserved_outputs.applied is None):
      raise ValueError("preserved_outputs must be the second output of the "
                       "embedding lookup (or dequeue) of this batch.")
    preserved_outputs.check_owner(self, "preserved_outputs")
    if preserved_outputs.applied:
      raise RuntimeError("apply_gradients was already called for this batch.")
    flat = step.check_gradients(self._config, self._output_shapes, gradients)
    combiner_updates = []
    for i in self._custom:  # to the kept rows and the combiner's weights
      table = self._config.features[i].table
      grad = flat[i]
      if grad is None:
        grad = tf.zeros(self._output_shapes[i].concatenate([table.dim]))
      flat[i], weight_grad = combiner_lib.backward(
          self._named(i), table.combiner, preserved_outputs.kept[i],
          preserved_outputs.rows[i],
          self._combiner_weights(table), tf.reshape(grad, [-1, table.dim]))
      if weight_grad is not None:
        combiner_updates.append((table, weight_grad))
    padded = []
    for grad, feature, stacked in zip(flat, self._config.features,
                                      self._stacked.features):
      extra = stacked.table.dim - feature.table.dim
      padded.append(grad if grad is None or not extra else tf.pad(
          grad, [[0, 0]] * (grad.shape.rank - 1) + [[0, extra]]))
    context = tf.distribute.get_replica_context()
    more = []
    for table, weight_grad in combiner_updates:
      # Summed outside the step's lock, which one replica may hold while
      # another waits for it here.
      if context is not None and context.num_replicas_in_sync > 1:
        weight_grad = context.all_reduce("sum", weight_grad)
      more.append(combiner_lib.weights_update(
          table, self._combiner_weights(table), weight_grad))
    step.apply(self._stacked, preserved_outputs.batch, padded, self._policy,
               more)
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
