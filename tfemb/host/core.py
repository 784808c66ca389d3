"""The engine core both generations are protocols over.

`EngineCore` owns what a step is computed with: the resolved configuration,
the table store, each table's path, the non-finite policy and the output
shapes, and builds the tables once (`build_once`). A `TableLayout` says how
the tables sit in variables: `Unstacked` for the first generation, the
SparseCore's stacked layout for `TPUEmbeddingV2`
(`tfemb.sparsecore.stacked_layout`). `tfemb.host.engine.HostEmbedding` and
`tfemb.sparsecore.engine.TPUEmbeddingV2` are `Engine`s, protocols over one
core each, so a table built inside `strategy.run` and a step's non-finite
handling behave the same in both.
"""

import abc
from typing import Any, Callable, Dict, List, Optional, Sequence

import tensorflow as tf

from tensorflow.python.trackable import autotrackable
from tensorflow.python.trackable import base as trackable

from tfemb import checkpoint_refusals
from tfemb import options as options_lib
from tfemb import resolution
from tfemb import shapes
from tfemb.host import global_batch
from tfemb.host import non_finite
from tfemb.host import step
from tfemb.host import table_paths
from tfemb.host import table_store
from tfemb.host import step_guards
from tfemb.host.paths import TablePath
from tfemb.serving import savedmodel

# What `tf.train.Checkpoint(root=engine)` keeps on the engine: its save
# counter, and the root again.
_CHECKPOINT_ROOT_CHILDREN = ("save_counter", "root")


def build_once(create: Callable[..., None]) -> None:
  """Runs `create` (which makes the tables and slots) once.

  Inside `strategy.run` of a strategy other than the default one (a model
  built in its first step: tf_keras' `fit` of an unbuilt subclassed model,
  Keras 3's `fit` of a distributed dataset, a first lookup in a custom
  step), every replica waits while `create` runs once, across replicas
  (`merge_call`); anywhere else it runs outside any `tf.function` being
  traced (`tf.init_scope`). `create` takes and ignores the strategy that
  `merge_call` passes.
  """
  create = tf.autograph.experimental.do_not_convert(create)
  if tf.distribute.has_strategy() and not (
      tf.distribute.in_cross_replica_context()):
    tf.distribute.get_replica_context().merge_call(create)
  else:
    with tf.init_scope():
      create()


class Engine(autotrackable.AutoTrackable):
  """What both generations' engines are over their core, `self._core` (an
  `EngineCore`): its build state, its non-finite policy's controls, and
  the checks and SavedModel children of their tables.

  A subclass defines `build()`, which builds the core.
  """

  _core: "EngineCore"

  def __init_subclass__(cls, **kwargs):
    """An engine that is also an instance of TensorFlow's class (its
    `tf.function` methods read a TPU's state this engine does not have)
    holds none of those methods: a SavedModel traces every `tf.function`
    an object holds."""
    super().__init_subclass__(**kwargs)
    for base in cls.__mro__[1:]:
      if not base.__module__.startswith("tensorflow."):
        continue
      for name, value in vars(base).items():
        if (isinstance(value, tf.types.experimental.PolymorphicFunction) and
            not any(name in vars(own) for own in cls.__mro__
                    if not own.__module__.startswith("tensorflow."))):
          setattr(cls, name, None)

  def build(self, *args, **kwargs):
    raise NotImplementedError

  def _maybe_build(self):
    if not self._core.built:
      with tf.init_scope():
        self.build()

  @property
  def built(self) -> bool:
    return self._core.built

  # TensorFlow's engines' attributes, which its tests read.
  @property
  def _built(self) -> bool:
    return self._core.built

  @property
  def _strategy(self):
    return self._core.strategy

  @property
  def strategy(self) -> tf.distribute.Strategy:
    """The strategy the engine was created under."""
    return self._core.strategy

  @property
  def resolved_config(self) -> resolution.Resolved:
    """The user's configuration as resolved once (`tfemb.resolution`):
    features and paths in `tf.nest` order, tables named, with their
    optimizers."""
    return self._core.config

  def _trackable_children(self, save_type=trackable.SaveType.CHECKPOINT,
                          **kwargs):
    children = super()._trackable_children(save_type, **kwargs)
    if save_type == trackable.SaveType.SAVEDMODEL and self._core.built:
      # What its functions read (`tfemb.serving.savedmodel`).
      children = savedmodel.children(children, self._core.tables,
                                     stacked=self._core.layout.views)
    return children

  def _lookup_dependency(self, name, cached_dependencies=None):
    """Refuses a checkpoint saved with other tables or another optimizer:
    TensorFlow asks this, with the object's children
    (`cached_dependencies`), for every child of this object in a checkpoint
    being restored. Asked without them, it is a probe for a free name
    (`tf.train.Checkpoint(root=engine)` asks for "save_counter"), which
    finds nothing. What such a checkpoint keeps on its root is not refused
    (`_CHECKPOINT_ROOT_CHILDREN`)."""
    found = super()._lookup_dependency(name, cached_dependencies)
    if (found is None and cached_dependencies is not None and
        not name.startswith("_") and name not in _CHECKPOINT_ROOT_CHILDREN):
      self._check_checkpoint_child(name)
    return found

  def _check_checkpoint_child(self, name: str) -> None:
    """Raises a ValueError for a child `name` of a checkpoint this object
    cannot restore (`table_store.TableStore.check_checkpoint_child`)."""
    self._core.store.check_checkpoint_child(name)

  @property
  def non_finite_gradients(self) -> str:
    """What a step with a NaN or Inf embedding gradient, or whose update
    would make a table or slot NaN or Inf, does.

    "raise" (default): an InvalidArgumentError naming the table, and no
    table or slot changes. "skip": no table or slot changes, the step is
    counted in `skipped_steps`, and training goes on.
    """
    return self._core.policy.mode

  @non_finite_gradients.setter
  def non_finite_gradients(self, policy: str):
    self._core.policy.mode = policy

  @property
  def skipped_steps(self) -> int:
    """Steps skipped for non-finite gradients or updates (policy
    "skip")."""
    return self._core.policy.skipped_steps


class TableLayout(abc.ABC):
  """How an engine's tables sit in variables: the piece `EngineCore` takes.

  A layout names the `TableConfig`s whose variables the core's
  `table_store.TableStore` checks checkpoints against (`tables`), the
  configuration a step trains (`step_config`: one table per user table,
  features in `tf.nest` order), creates the variables as children of the
  engine, and picks each trained table's path. `Unstacked` is the first
  generation's: one variable per table. The SparseCore's stacked layout
  (`tfemb.sparsecore.stacked_layout.StackedLayout`) keeps each table in its
  own variable under stacked views, the names a checkpoint holds.
  """

  @property
  @abc.abstractmethod
  def tables(self) -> List[Any]:
    """The configs of the variables a checkpoint holds."""

  @property
  @abc.abstractmethod
  def step_config(self) -> resolution.Resolved:
    """The tables and features a step trains."""

  @abc.abstractmethod
  def create(self, owner, store: table_store.TableStore
            ) -> Dict[str, table_store.TableVariables]:
    """Creates the variables as children of the trackable `owner`; returns
    each trained table's, by table name."""

  @abc.abstractmethod
  def training_path(self, table, variables: table_store.TableVariables,
                    partitioned: bool, options) -> TablePath:
    """The path of `table`'s (a `step_config` table's) training steps."""

  @property
  def views(self) -> Optional[Dict[str, table_store.TableVariables]]:
    """Variables a checkpoint holds in place of the tables' own, by
    stacked table name; None where it holds the tables'."""
    return None


class Unstacked(TableLayout):
  """One variable per table (and per slot), as TensorFlow's `TPUEmbedding`
  names them."""

  def __init__(self, config: resolution.Resolved):
    self._config = config

  @property
  def tables(self) -> List[Any]:
    return self._config.tables

  @property
  def step_config(self) -> resolution.Resolved:
    return self._config

  def create(self, owner, store):
    return store.create(owner)

  def training_path(self, table, variables, partitioned, options):
    return table_paths.training_path(table, variables, partitioned, options)


class EngineCore:
  """The parts an engine computes its steps with, wired once.

  Owns the resolved configuration, the table store, the tables' paths, the
  non-finite policy and the output shapes fixed so far, and builds the
  tables once (`build_once`). The engines are protocols over it:
  `tfemb.host.engine.HostEmbedding` (the first generation's, under
  `tfemb.TPUEmbedding`'s enqueue/dequeue) and `tfemb.TPUEmbeddingV2`.

  Args:
    config: the user's configuration, resolved (`tfemb.resolution`).
    layout: the tables' `TableLayout` (`Unstacked(config)` when None).
    strategy: the strategy the engine was created under.
  """

  def __init__(self, config: resolution.Resolved,
               layout: Optional[TableLayout] = None, strategy=None):
    self.config = config
    self.layout = layout or Unstacked(config)
    self.strategy = strategy or tf.distribute.get_strategy()
    self.options = options_lib.get()
    self.store = table_store.TableStore(self.layout.tables, self.strategy,
                                          self.options)
    self.policy = non_finite.NonFinitePolicy(self.strategy)
    self.output_shapes = [f.output_shape for f in config.features]
    self.tables: Optional[Dict[str, table_store.TableVariables]] = None
    self.paths: Optional[List[TablePath]] = None

  @property
  def built(self) -> bool:
    return self.tables is not None

  def build(self, owner, then: Optional[Callable[[Any], None]] = None,
            before: Optional[Callable[[], None]] = None):
    """Creates the tables once, as children of `owner`, then their paths;
    `before()` runs once first (it may refuse: nothing is created), and
    `then(tables)` right after, where the tables were created (the
    engine's own variables beside them, its attributes)."""
    if self.built:
      return

    def create(*unused_strategy):
      if self.built:  # another replica's merge_call got here first
        return
      if before is not None:
        before()
      with checkpoint_refusals.unreadable_restore_dropped(owner):
        tables = self.layout.create(owner, self.store)
      partitioned = self.store.partitioned
      self.paths = [
          self.layout.training_path(t, tables[t.name], partitioned,
                                    self.options)
          for t in self.layout.step_config.tables]
      if then is not None:
        then(tables)
      self.tables = tables

    build_once(create)

  def fix_shapes(self, incoming) -> None:
    """Fixes the output shapes `incoming` gives (`tfemb.shapes.fix`)."""
    self.output_shapes = self.shapes_with(incoming)

  def shapes_with(self, incoming) -> List[Any]:
    """The output shapes fixed so far, with those `incoming` gives
    (`tfemb.shapes.fix`); nothing is stored."""
    return shapes.fix(self.config.paths, self.output_shapes, incoming)

  def looks_up_globally(self) -> bool:
    """Whether a lookup here is a replica's part of the global batch's
    (`tfemb.host.global_batch`)."""
    return self.store.one_copy and global_batch.applies()

  def reading_inputs(self):
    """Where the batch's inputs are read (`tfemb.host.global_batch.reading`):
    on the host for the global batch's lookup."""
    return global_batch.reading(self.looks_up_globally())

  def gather(self, feature_ids: Sequence[int], lookups) -> step.Batch:
    """The batch's lookups of `feature_ids`, each table's ids once: where
    the replicas share one copy of the tables, this replica's `Share` of
    the global batch, looked up once (`tfemb.host.global_batch`)."""
    step_guards.refuse_xla("An embedding lookup")
    step_guards.check_strategy(self.strategy, "The embedding engine")
    if self.looks_up_globally():
      return global_batch.gather(self.layout.step_config, self.paths,
                                 feature_ids, lookups)
    return step.gather(self.layout.step_config, self.paths, feature_ids,
                       lookups)

  def activations(self, batch: step.Batch, feature_ids: Sequence[int],
                  static_shapes=None) -> List[Any]:
    """The flat activations of `feature_ids` (`step.activations`)."""
    if isinstance(batch, global_batch.Share):
      return global_batch.activations(self.layout.step_config, batch,
                                      feature_ids, static_shapes)
    return step.activations(self.layout.step_config, batch, feature_ids,
                            static_shapes)

  def check_gradients(self, gradients) -> List[Any]:
    """The flat gradients, checked against the output shapes."""
    return step.check_gradients(self.config, self.output_shapes, gradients)

  def apply(self, batch: step.Batch, flat_grads,
            more: Sequence[step.Update] = (), loss_scaled: bool = False
            ) -> None:
    """The batch's update, all or nothing under the policy
    (`step.apply`)."""
    step_guards.refuse_xla("An embedding update")
    step_guards.check_strategy(self.strategy, "The embedding engine")
    if isinstance(batch, global_batch.Share):
      global_batch.apply(self.layout.step_config, batch, flat_grads,
                         self.policy, more, loss_scaled)
      return
    step.apply(self.layout.step_config, batch, flat_grads, self.policy, more,
               loss_scaled, one_copy=self.store.one_copy)
