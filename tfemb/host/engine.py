"""The host engine: TensorFlow's TPU embedding API on CPU and GPU.

`HostEmbedding` runs `build` / `enqueue` / `dequeue` / `apply_gradients`
and direct lookups with the TPU's numbers (docs/numerics.md), as the first
generation's protocol over the engine core (`core.EngineCore`, one
variable per table: `core.Unstacked`), which owns the resolved configs,
the tables and slots (`variables.TableStore`, TensorFlow's checkpoint
names), each table's path (the fused CPU kernels or TensorFlow's ops), the
non-finite policy and the one build. What is its own here: TensorFlow's
`build` arguments and attributes, the tables by `TableConfig`, the
parameter servers' partitioner, direct lookups, and `forward`, the batch's
activations with the function that applies its gradients (the TPU
protocol, `tfemb.mid_level`, holds it between `dequeue` and
`apply_gradients`).

No tensor of a table's size is built in a step (non-lazy Adam excepted, as
on the TPU).
"""

import dataclasses
from typing import Any, Optional

import tensorflow as tf
from tensorflow.python.trackable import data_structures
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import heap
from tfemb import input_dtypes
from tfemb import inputs
from tfemb import optimizers
from tfemb import resolution
from tfemb import shapes
from tfemb.host import core
from tfemb.host import feeding
from tfemb.host import step
from tfemb.host import table_paths
from tfemb.host import by_table

_no_autograph = tf.autograph.experimental.do_not_convert


@dataclasses.dataclass(frozen=True)
class InputRules:
  """How `HostEmbedding.forward` reads a batch's inputs and shapes its
  activations.

  Attributes:
    tpu: the TPU protocol's `enqueue`: the inputs' own shapes are checked
      against the shapes fixed by the FeatureConfigs, `build` or the first
      enqueue, which then shape the activations, and they must be fully
      known (a batch dimension of None, e.g. `Dataset.batch` without
      `drop_remainder=True`, is refused here as it would be on a TPU).
    serving_fallback: an input the TPU's rules refuse but TensorFlow's
      serving class takes (`inputs.serving_only`) follows the serving
      class's rules and shapes, as in tensorflow-recommenders' layer off
      the TPU.
    fixes_shapes: the batch's shapes hold for later batches too (else for
      this batch only: the Keras layer's, where only `batch_size` or a
      FeatureConfig's `output_shape` fix them).
  """
  tpu: bool = False
  serving_fallback: bool = False
  fixes_shapes: bool = True


TRAINING = InputRules()  # a batch looked up for training, as it comes
TPU_PROTOCOL = InputRules(tpu=True)  # `enqueue`'s
# The Keras layer off the TPU, as tensorflow-recommenders' layer there: any
# batch size in any call (a fit with one, a predict with another), and what
# only the serving class takes with its shapes.
KERAS_LAYER = InputRules(serving_fallback=True, fixes_shapes=False)


class HostEmbedding(core.Engine):
  """`tf.tpu.experimental.embedding.TPUEmbedding`, computed on the host.

  Args:
    feature_config: a nested structure (`tf.nest`) of `FeatureConfig`s,
      tfemb's or TensorFlow's. Never changed: tables are named and given
      the global optimizer in copies (`tfemb.resolution`).
    optimizer: the optimizer for every table without its own: an instance of
      `tfemb.SGD`, `Adagrad`, `AdagradMomentum`, `Adam` or `FTRL` (or
      TensorFlow's class of the same name), or None for lookups only.
    pipeline_execution_with_tensor_core: a TPU scheduling hint; accepted and
      kept, no effect on the host.

  The current `tfemb.options` (fused kernels, interleaved slots, malloc
  tuning) are those of this object from its construction on.
  """

  def __init__(self,
               feature_config: Any,
               optimizer: Optional[Any],
               pipeline_execution_with_tensor_core: bool = False):
    config = resolution.resolve(feature_config, optimizer)
    for table in config.tables:
      if optimizers.is_custom(table.optimizer) or not isinstance(
          table.combiner, str):
        raise ValueError(
            f"Table {table.name!r}: only TPUEmbeddingV2 (SparseCore) "
            "supports CustomOptimizer and CustomCombiner; use "
            "tfemb.TPUEmbeddingV2.")
      if table.dtype != tf.float32:
        raise ValueError(f"Table {table.name!r}: only float32 tables are "
                         f"supported, got dtype {table.dtype.name}.")
    self._feature_config = config.given
    self._pipeline_execution_with_tensor_core = (
        pipeline_execution_with_tensor_core)
    self._core = data_structures.NoDependency(core.EngineCore(config))
    self._table_config = config.tables  # as TensorFlow's attribute

  # --- tables -------------------------------------------------------------

  def build(self, per_replica_input_shapes=None, per_replica_batch_size=None):
    """Creates the tables and slots; fixes the output shapes if given.

    Args:
      per_replica_input_shapes: a nested structure of input shapes matching
        `feature_config` (or an int batch size, deprecated in TF).
      per_replica_batch_size: (deprecated in TF) the batch size.
    """
    if self._core.built:
      return
    config = self._core.config
    features = config.features
    incoming = None
    if per_replica_input_shapes is not None and not isinstance(
        per_replica_input_shapes, int):
      nest.assert_same_structure(
          nest.flatten(per_replica_input_shapes), features)
      incoming = [shapes.from_input_shape(s, f) for s, f in zip(
          nest.flatten(per_replica_input_shapes), features)]
    else:
      batch = per_replica_input_shapes or per_replica_batch_size
      if batch:
        incoming = [shapes.from_batch_size(batch, f) for f in features]
    if incoming is not None:
      self._core.fix_shapes(incoming)
    # TF's TPU rule, for the shapes known so far (TF's TPU engine also
    # refuses a plain `build()` before any shape is known, and so does
    # `tfemb.TPUEmbedding` on a host TPU; elsewhere, as in TensorFlow's
    # serving class, the shapes then come from the first enqueue).
    shapes.check_fully_defined(config.paths, self._core.output_shapes,
                               known_rank_only=True)

    def then(tables):
      self._variables = tables  # tracked, as TensorFlow's engine does
      self._lookup_paths = data_structures.NoDependency([
          table_paths.OpsTable(t, tables[t.name]) for t in config.tables])

    self._core.build(self, then, self._configure_tpu)
    heap.keep_freed_buffers(self._core.options)

  def _configure_tpu(self) -> None:
    """What a TPU does as the tables are created: nothing on the host
    (`tfemb.TPUEmbedding` configures a host TPU's embedding engine)."""

  @property
  def _output_shapes(self):
    """The output shapes fixed so far (TensorFlow's attribute)."""
    return self._core.output_shapes

  @_output_shapes.setter
  def _output_shapes(self, output_shapes):
    self._core.output_shapes = output_shapes


  # TensorFlow's TPUEmbedding copies the tables between the TPU and their
  # host variables with these (its tests call them around every check);
  # on the host the variables are the tables, so there is nothing to copy.
  def _load_variables(self):
    pass

  def _retrieve_variables(self):
    pass

  @property
  def table_partitioner(self):
    """How tables and slots are sharded over parameter servers.

    Under `ParameterServerStrategy`, tables are created as TensorFlow
    `ShardedVariable`s by the strategy's `variable_partitioner`; set this
    (e.g. `tf.distribute.experimental.partitioners.MinSizePartitioner(...)`)
    before the tables are created to shard them differently from the rest
    of the model. Lookups and updates are routed per shard.
    """
    return self._core.store.partitioner

  @table_partitioner.setter
  def table_partitioner(self, partitioner):
    if self._core.built:
      raise RuntimeError("Set table_partitioner before the tables are "
                         "created (before build() or the first enqueue).")
    if not self._core.store.partitioned:
      raise ValueError(
          "table_partitioner needs the TPUEmbedding to be created under a "
          f"ParameterServerStrategy, not {type(self._core.strategy).__name__}.")
    self._core.store.partitioner = partitioner

  @property
  def embedding_tables(self):
    """A dict of the embedding tables, keyed by `TableConfig` (the user's
    objects, their resolved copies in `_table_config`, or names)."""
    self._maybe_build()
    return self._by_table({t: self._variables[t.name]["parameters"]
                           for t in self._core.config.tables})

  @property
  def variables(self):
    """A dict of `{"parameters": table, slot name: slot}`, by `TableConfig`
    (as TensorFlow documents it); `variables["name"]` also finds a table by
    its name (as TensorFlow's serving class in fact keys it)."""
    self._maybe_build()
    return self._by_table({t: dict(self._variables[t.name])
                           for t in self._core.config.tables})

  def _by_table(self, items):
    config = self._core.config
    aliases = {id(user): ours for user, ours in zip(config.user_tables,
                                                    config.tables)}
    return by_table.ByTableConfig(items, aliases)

  def _checkpoint_adapter(self, path: str):
    """Refuses a checkpoint of another configuration before anything of it
    is restored (or deferred until `build`): a restore is all or nothing."""
    self._core.store.check_checkpoint(path)
    return super()._checkpoint_adapter(path)

  # --- lookups ------------------------------------------------------------

  @_no_autograph
  def __call__(self, features: Any, weights: Optional[Any] = None) -> Any:
    """Looks features up directly, as `TPUEmbeddingForServing` does (and
    takes the dtypes it takes: `input_dtypes.SERVING`).

    `features` may hold any subset of the configured features (by path).
    Differentiable with respect to the tables (plain TensorFlow ops), and it
    never changes a table.
    """
    return self.embedding_lookup(features, weights)

  @_no_autograph
  def embedding_lookup(self, features: Any, weights: Optional[Any] = None):
    return self.direct_lookup(features, weights, input_dtypes.SERVING)

  def direct_lookup(self, features: Any, weights: Optional[Any],
                    dtypes: input_dtypes.InputDtypes):
    """`embedding_lookup` with the ids and weights the lookup of `dtypes`
    takes (TensorFlow's serving class's, or `TPUEmbeddingV0`'s)."""
    self._maybe_build()
    config = self._core.config
    feature_ids, flat, flat_weights = feeding.flat_inputs(
        config, features, weights, True)
    lookups = feeding.lookups(config, feature_ids, flat, flat_weights, dtypes,
                              True)
    batch = step.gather(config, self._lookup_paths, feature_ids, lookups)
    flat = step.activations(config, batch, feature_ids)
    return nest.pack_sequence_as(features, flat)

  # --- training -------------------------------------------------------------

  @_no_autograph
  def forward(self, features, weights=None,
              rules: "InputRules" = None):
    """Looks up a training batch; returns `(activations, backward)`.

    `activations` has the structure of `feature_config` and TF's output
    shapes. `backward(gradients)` applies the embedding optimizer for this
    batch, given the gradient of the loss with respect to `activations`;
    it may be called once. `backward(gradients, loss_scaled=True)` skips a
    step whose gradients are not finite, writing nothing, whatever
    `non_finite_gradients` says (Keras' loss scaling: `step.apply`).
    Nothing is stored on the object, so the Keras layer can look up several
    batches in one step. `rules`: how the inputs are read and shaped
    (default `TRAINING`; the Keras layer's are `KERAS_LAYER`).
    """
    return self.activate(*self.prepare(features, weights, rules or TRAINING))

  def prepare(self, features, weights, rules: "InputRules"):
    """Checks the inputs (ids cast to int64 and weights to float32, as
    TensorFlow's `TPUEmbedding.enqueue` casts them: `input_dtypes.V1`;
    building on first use) and looks the ids up;
    returns the batch and the output shapes of its activations (fixed for
    later batches too where `rules.fixes_shapes`): `forward`'s first half,
    which the TPU protocol's `enqueue` runs."""
    config = self._core.config
    global_part = self._core.looks_up_globally()
    with self._core.reading_inputs():
      feature_ids, flat, flat_weights = feeding.flat_inputs(
          config, features, weights, False)
      if rules.tpu:
        for path, x in zip(config.paths, flat):  # before any shape is fixed
          error = inputs.input_shape_error(path, x)
          if error:
            raise ValueError(error)
        incoming = [shapes.from_enqueued(x, f)
                    for x, f in zip(flat, config.features)]
        if not self._core.built:  # built with them, as TensorFlow's enqueue
          self._core.fix_shapes(incoming)
      else:
        serving = [rules.serving_fallback and
                   inputs.serving_only(x.shape, shapes.kind_of(x))
                   for x in flat]
        lookups = feeding.lookups(config, feature_ids, flat, flat_weights,
                                  input_dtypes.V1, serving,
                                  global_part=global_part)
        incoming = [shapes.of_input(x, f, s)
                    for x, f, s in zip(flat, config.features, serving)]
    self._maybe_build()  # outside the inputs' device: the tables have theirs
    output_shapes = self._core.shapes_with(incoming)
    if rules.fixes_shapes:
      self._core.output_shapes = output_shapes
    with self._core.reading_inputs():
      if rules.tpu:
        shapes.check_fully_defined(config.paths, output_shapes)
        lookups = feeding.lookups(config, feature_ids, flat, flat_weights,
                                  input_dtypes.V1, False, list(output_shapes),
                                  global_part)
      return self._core.gather(feature_ids, lookups), output_shapes

  def activate(self, batch: step.Batch, output_shapes):
    """`forward`'s second half (`dequeue`'s): the activations of a
    prepared batch, with the function that applies its gradients."""
    config = self._core.config
    feature_ids = list(range(len(config.features)))
    flat = self._core.activations(batch, feature_ids, output_shapes)
    applied = []

    def backward(gradients, loss_scaled=False):
      if applied:
        raise RuntimeError(
            "apply_gradients was already called for this batch: call it once "
            "per enqueue.")
      self._core.apply(
          batch, step.check_gradients(config, output_shapes, gradients),
          loss_scaled=loss_scaled)
      applied.append(True)  # a refused step wrote nothing: not used up

    return nest.pack_sequence_as(config.structure, flat), backward

  def check_gradients(self, gradients) -> None:
    """TensorFlow's errors for gradients of the wrong structure or shape
    (against the output shapes fixed so far)."""
    self._core.check_gradients(gradients)
