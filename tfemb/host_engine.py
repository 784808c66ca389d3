"""The host engine: TensorFlow's TPU embedding API on CPU and GPU.

`HostEmbedding` runs `build` / `enqueue` / `dequeue` / `apply_gradients` with
TensorFlow ops only, with the TPU's numbers (SPEC section 2):

* forward: per table, the ids of every feature that shares it are
  deduplicated once (`tf.unique`) and gathered once (a resource gather); each
  feature then combines its rows with `unsorted_segment_sum`;
* backward: the activation gradients go back through the same segments, are
  summed per distinct row, and `tfemb.update_rules` updates just those rows
  and their slots (resource gather, pure update, resource scatter). No tensor
  of a table's size is built in a step (non-lazy Adam excepted, as the TPU).

On the CPU, a training step does the per-table parts with the fused kernels
of `tfemb.kernels` (one op per table for the deduplication and gather, one
for the row-gradient sum, one for the update) when they can be built and the
table's variables are CPU variables, plain or mirrored (each replica's
kernels on its own copy); otherwise, and for direct lookups, with the
TensorFlow ops above. Both give the same numbers.

The tables and slots themselves live in `tfemb.table_variables`; the
update of the touched rows in `tfemb.sparse_update`.
"""

import weakref
from typing import Any, Dict, List, NamedTuple, Optional

from absl import logging
import tensorflow as tf
from tensorflow.python.trackable import data_structures

from tfemb import heap
from tfemb import inputs
from tfemb import replicas
from tfemb import sparse_update
from tfemb import table_variables
from tfemb import update_rules
from tfemb import validation
from tfemb.kernels import ops as kernel_ops

from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import
_no_autograph = tf.autograph.experimental.do_not_convert


class _TableBatch(NamedTuple):
  """One table's share of a batch: its distinct ids, and where each id of
  each of its features sits among them."""
  unique_ids: tf.Tensor
  positions: List[tf.Tensor]  # per feature of this table
  features: List[int]  # flat feature indices, parallel to positions
  # From the fused kernel: every feature's positions, concatenated, and each
  # id's row, per feature. None: TensorFlow ops (rows gathered later).
  fused_positions: Optional[tf.Tensor] = None
  id_rows: Optional[List[tf.Tensor]] = None


class _TableUpdate(NamedTuple):
  """One table's part of a step's update, ready to write."""
  table: Any  # its TableConfig
  ids: tf.Tensor  # distinct ids (the global batch's under several replicas)
  rows: Optional[tf.Tensor]  # their rows as looked up; None: read them again
  grads: tf.Tensor  # summed gradient per distinct id
  finite: Any  # the gradients' finite check (assert ops, bool or kernel's)
  fused: bool  # written by the fused kernel


class _Batch(NamedTuple):
  lookups: Dict[int, inputs.Lookup]  # by flat feature index
  tables: List[Optional[_TableBatch]]  # by table index; None: unused
  checks: List[tf.Operation]  # every input check; updates wait for them


def _graph_key():
  return tf.compat.v1.get_default_graph()


def _is_optimizer(opt) -> bool:
  try:
    update_rules.rule_name(opt)
    return True
  except ValueError:
    return False


class HostEmbedding(table_variables.TableVariables):
  """`tf.tpu.experimental.embedding.TPUEmbedding`, computed on the host.

  Args:
    feature_config: a nested structure (`tf.nest`) of `FeatureConfig`s,
      tfemb's or TensorFlow's.
    optimizer: the optimizer for every table without its own: an instance of
      `tfemb.SGD`, `Adagrad`, `AdagradMomentum`, `Adam` or `FTRL` (or
      TensorFlow's class of the same name), or None for lookups only.
    pipeline_execution_with_tensor_core: a TPU scheduling hint; accepted and
      kept, no effect on the host.
  """

  def __init__(self,
               feature_config: Any,
               optimizer: Optional[Any],
               pipeline_execution_with_tensor_core: bool = False):
    self._feature_config = feature_config
    self._strategy = tf.distribute.get_strategy()
    self._pipeline_execution_with_tensor_core = (
        pipeline_execution_with_tensor_core)
    flat = nest.flatten_with_joined_string_paths(feature_config)
    for path, feature in flat:
      if not hasattr(feature, "table") or not hasattr(feature,
                                                      "max_sequence_length"):
        raise TypeError(
            f"feature_config[{path!r}] must be a FeatureConfig, got "
            f"{type(feature).__name__}.")
    self._paths = [path for path, _ in flat]
    self._features = [feature for _, feature in flat]
    self._output_shapes = [f.output_shape for f in self._features]
    self._table_config = []
    for feature in self._features:
      if feature.table not in self._table_config:
        self._table_config.append(feature.table)
    table_names = []
    for i, table in enumerate(self._table_config):
      given = getattr(table, "_tfemb_global_optimizer", None)
      if (given is not None and table.optimizer is given and
          optimizer is not None and optimizer != given):
        raise ValueError(
            f"TableConfig {table.name!r} is already used by another "
            f"TPUEmbedding, which gave it its optimizer {given!r}; this one "
            f"was given {optimizer!r}. Use a separate TableConfig per "
            "TPUEmbedding, or set the table's own optimizer.")
      if table.optimizer is None:
        table.optimizer = optimizer
        table._tfemb_global_optimizer = optimizer  # pylint: disable=protected-access
      if table.optimizer is not None and not _is_optimizer(table.optimizer):
        raise ValueError(
            f"{type(table.optimizer)} is an unsupported optimizer class. "
            "Please pass an instance of one of the optimizer classes under "
            "tfemb or tf.tpu.experimental.embedding.")
      if table.name is None:
        table.name = "table_{}".format(i)
      if table.name in table_names:
        raise ValueError("Tables must have a unique name. "
                         f"Multiple tables with name {table.name} found.")
      if table.dtype != tf.float32:
        raise ValueError(f"Table {table.name!r}: only float32 tables are "
                         f"supported, got dtype {table.dtype.name}.")
      table_names.append(table.name)
    self._table_index = [
        self._table_config.index(f.table) for f in self._features
    ]
    self._built = False
    # By table name: whether training steps use tfemb.kernels (decided on
    # the first step). Not tracked: it is no state of the model.
    self._fused = data_structures.NoDependency({})
    self._non_finite = "raise"
    self._skipped = None
    self._partitioner = None
    self._enqueued = weakref.WeakKeyDictionary()
    self._dequeued = weakref.WeakKeyDictionary()

  # --- variables --------------------------------------------------------

  def build(self, per_replica_input_shapes=None, per_replica_batch_size=None):
    """Creates the tables and slots; fixes the output shapes if given.

    Args:
      per_replica_input_shapes: a nested structure of input shapes matching
        `feature_config` (or an int batch size, deprecated in TF).
      per_replica_batch_size: (deprecated in TF) the batch size.
    """
    if self._built:
      return
    shapes = None
    if per_replica_input_shapes is not None and not isinstance(
        per_replica_input_shapes, int):
      nest.assert_same_structure(
          nest.flatten(per_replica_input_shapes), self._features)
      shapes = [
          self._output_shape_from_input_shape(tf.TensorShape(s), f)
          for s, f in zip(nest.flatten(per_replica_input_shapes),
                          self._features)
      ]
    else:
      batch = per_replica_input_shapes or per_replica_batch_size
      if batch:
        shapes = [
            tf.TensorShape([batch, f.max_sequence_length]) if
            (not f.output_shape and f.max_sequence_length > 0) else
            tf.TensorShape([batch]) for f in self._features
        ]
    if shapes is not None:
      self._check_output_shapes(shapes)
      self._update_output_shapes(shapes)
    # TF's TPU rule, for the shapes known so far: a shape given with a
    # dimension of None is refused here. (TF's TPU engine also refuses a
    # plain `build()` before any shape is known; here, as in TensorFlow's
    # serving class, the shapes then come from the first enqueue.)
    self._check_output_shapes_fully_defined(known_rank_only=True)
    # Created under the strategy the object was made in (mirrored copies
    # under MirroredStrategy), whenever the first enqueue happens.
    def create(*unused_strategy):
      with tf.init_scope(), self._strategy.scope(), self._partitioning():
        self._variables = self._create_variables_and_slots()

    if replicas.in_replica_context_of(self._strategy):
      # A model built in its first step (tf_keras' fit of an unbuilt
      # subclassed model, Keras 3's fit of a distributed dataset): every
      # replica waits while the tables are created once, across replicas.
      tf.distribute.get_replica_context().merge_call(create)
    else:
      create()
    # A step's buffers, freed, stay in the process at any table size.
    heap.keep_freed_buffers()
    self._built = True

  # TensorFlow's TPUEmbedding copies the tables between the TPU and their
  # host variables with these (its tests call them around every check);
  # on the host the variables are the tables, so there is nothing to copy.
  def _load_variables(self):
    pass

  def _retrieve_variables(self):
    pass

  def _create_config_proto(self):
    """The `TPUEmbeddingConfiguration` TensorFlow's TPU engine would build
    for these configs and output shapes under the current strategy (one
    replica per device, one host per worker)."""
    from tfemb.tpu import config_proto  # pylint: disable=g-import-not-at-top
    self._check_output_shapes_fully_defined()
    resolved = config_proto.resolve(self._feature_config, None)
    extended = self._strategy.extended
    return config_proto.config_proto(
        resolved, self._output_shapes,
        num_replicas=self._strategy.num_replicas_in_sync,
        num_hosts=getattr(extended, "num_hosts", 1),
        pipeline_execution_with_tensor_core=(
            self._pipeline_execution_with_tensor_core))

  @staticmethod
  def _output_shape_from_input_shape(shape, feature):
    if shape.rank is None or shape.rank < 1:
      raise ValueError(
          f"Received input tensor of shape {shape}. Rank must be 1 and above")
    if (shape.rank == 2 and shape[-1] != 1 and not feature.output_shape and
        feature.max_sequence_length > 0):
      return tf.TensorShape([shape[0], feature.max_sequence_length])
    return shape if shape.rank == 1 else shape[:-1]

  def _maybe_build(self, output_shapes=None):
    if not self._built:
      with tf.init_scope():
        self.build()
    if output_shapes is not None:
      self._check_output_shapes(output_shapes)
      self._update_output_shapes(output_shapes)

  # --- shapes -----------------------------------------------------------

  def _update_output_shapes(self, incoming):
    self._output_shapes = [
        old if old else new for old, new in zip(self._output_shapes, incoming)
    ]

  def _check_output_shapes(self, incoming):
    """TF's rule: a known dimension may not change between calls."""
    for path, old, new in zip(self._paths, self._output_shapes, incoming):
      if not old or not new:
        continue
      if len(new) in (1, 2) and len(old) > len(new):
        continue
      if len(old) != len(new) or any(
          a is not None and b is not None and a != b
          for a, b in zip(old.as_list(), new.as_list())):
        raise ValueError(
            f"Inconsistent shape founded for input feature {path}, "
            f"Output shape is set to be {old}, "
            f"But got incoming output shape {new}")

  # --- lookups ------------------------------------------------------------

  def _flatten_inputs(self, features, weights, serving):
    """Validates the structure and turns every feature into a Lookup."""
    return self._lookups(*self._flat_inputs(features, weights, serving),
                         serving)

  def _flat_inputs(self, features, weights, serving):
    """Checks the structures; the feature indices, inputs and weights."""
    if serving:
      flat_features = self._match_subset(features)
    else:
      self._check_structure(features)
      flat_features = list(range(len(self._features)))
    flat_inputs = nest.flatten(features)
    flat_weights = [None] * len(flat_inputs)
    if weights is not None:
      try:
        nest.assert_same_structure(features, weights)
      except (ValueError, TypeError) as e:
        raise type(e)("weights must have the structure of the features, "
                      f"with None where a feature has no weights: {e}"
                     ) from None
      flat_weights = nest.flatten(weights)
    return (flat_features, [inputs.as_input(x) for x in flat_inputs],
            flat_weights)

  def _lookups(self, flat_features, flat_inputs, flat_weights, serving,
               fixed_shapes=None):
    """One Lookup per input (`fixed_shapes`: the TPU protocol's activation
    shapes, per feature)."""
    lookups = []
    for i, x, w in zip(flat_features, flat_inputs, flat_weights):
      path, feature = self._paths[i], self._features[i]
      lookups.append(inputs.to_lookup(
          path, x, w, feature, serving=serving,
          fixed_shape=None if fixed_shapes is None else fixed_shapes[i]))
    return flat_features, lookups

  def _check_structure(self, value, what="features"):
    try:
      nest.assert_same_structure(self._feature_config, value)
    except (ValueError, TypeError) as e:
      raise type(e)(f"{what} must have the structure of feature_config "
                    f"({self._paths}): {e}") from None

  def _match_subset(self, features):
    """For direct lookups: the inputs' paths must be features' paths."""
    index = {path: i for i, path in enumerate(self._paths)}
    paths = [p for p, _ in nest.flatten_with_joined_string_paths(features)]
    unknown = [p for p in paths if p not in index]
    if unknown:
      raise ValueError(
          f"Inputs are not a subset of feature_config. Unknown feature(s) "
          f"{unknown}; feature_config has {self._paths}.")
    return [index[p] for p in paths]

  def _uses_fused_kernels(self, t) -> bool:
    """Whether training steps use `tfemb.kernels` for table `t`."""
    table = self._table_config[t]
    if table.name not in self._fused:
      self._fused[table.name] = (
          not self._is_partitioned() and
          kernel_ops.usable(self._variables[table.name], table.optimizer))
    return self._fused[table.name]

  def _gather_batch(self, feature_ids, lookups, fused=False) -> _Batch:
    """Deduplicates the ids once per table (after checking their range).

    With `fused` (the enqueue / forward path; not direct lookups, which stay
    differentiable), tables that can use the fused kernels are also
    gathered here, in the same op.
    """
    by_table = {}
    for i, lookup in zip(feature_ids, lookups):
      by_table.setdefault(self._table_index[i], []).append((i, lookup))
    tables = [None] * len(self._table_config)
    all_checks = []
    for t, members in by_table.items():
      if fused and self._uses_fused_kernels(t):
        tables[t] = self._fused_gather(t, members, all_checks)
        continue
      vocab = self._table_config[t].vocabulary_size
      checks = []
      for i, lookup in members:
        checks += list(lookup.checks)
        if self._features[i].validate_weights_and_indices:
          checks += validation.id_range(self._paths[i], lookup.ids, vocab)
      all_checks += checks
      with tf.control_dependencies(checks):  # no gather before the checks
        all_ids = tf.identity(_concat([lookup.ids for _, lookup in members]))
      unique_ids, idx = tf.unique(all_ids, out_idx=tf.int64)
      sizes = [tf.size(lookup.ids) for _, lookup in members]
      positions = tf.split(idx, sizes) if len(members) > 1 else [idx]
      tables[t] = _TableBatch(unique_ids, positions, [i for i, _ in members])
    return _Batch(dict(zip(feature_ids, lookups)), tables, all_checks)

  def _fused_gather(self, t, members, all_checks) -> _TableBatch:
    """One kernel: the range check (naming the feature), dedup, gather."""
    table = self._table_config[t]
    checks = [c for _, lookup in members for c in lookup.checks]
    with tf.control_dependencies(checks):
      unique_ids, positions, rows = kernel_ops.dedup_gather(
          table, self._variables[table.name]["parameters"],
          [lookup.ids for _, lookup in members],
          [self._paths[i] for i, _ in members])
    # Every update of the step waits for this table's range check too.
    all_checks += checks + [unique_ids]
    if len(members) > 1:
      sizes = [tf.size(lookup.ids) for _, lookup in members]
      split_positions, id_rows = tf.split(positions, sizes), tf.split(
          rows, sizes)
    else:
      split_positions, id_rows = [positions], [rows]
    return _TableBatch(unique_ids, split_positions, [i for i, _ in members],
                       positions, id_rows)

  def _activations(self, feature_ids, batch: _Batch, static_shapes):
    """Gathers each table's distinct rows once and combines per feature.

    Returns the flat activations and, per table index, the gathered rows
    (before any simulated quantization), which the update reuses.
    """
    out, gathered = {}, {}
    for t, table_batch in enumerate(batch.tables):
      if table_batch is None:
        continue
      table = self._table_config[t]
      rows = None
      if table_batch.id_rows is None:
        rows = table_variables.gather_rows(
            self._variables[table.name]["parameters"], table_batch.unique_ids)
        gathered[t] = rows
        if table.quantization_config is not None:
          rows = _quantize(rows, table.quantization_config)
      for k, (i, pos) in enumerate(
          zip(table_batch.features, table_batch.positions)):
        lookup = batch.lookups[i]
        if rows is None:  # the fused kernel gathered each id's row
          emb = table_batch.id_rows[k]
          if table.quantization_config is not None:
            emb = _quantize(emb, table.quantization_config)
        else:
          emb = tf.gather(rows, pos)
        if lookup.scales is not None:
          emb = emb * lookup.scales[:, None]
        if lookup.segments is not None:
          emb = tf.math.unsorted_segment_sum(emb, lookup.segments,
                                             lookup.num_segments)
        if lookup.static_shape.is_fully_defined():  # known when traced
          shape = lookup.static_shape.concatenate([table.dim])
          if emb.shape != shape:
            emb = tf.reshape(emb, shape.as_list())
        else:
          emb = tf.reshape(
              emb, tf.concat([lookup.output_shape, [table.dim]], axis=0))
        static = static_shapes[i] if static_shapes else lookup.static_shape
        if static.rank is not None:
          static = static.concatenate([table.dim])
          if not (emb.shape.is_fully_defined() and emb.shape == static):
            emb = tf.ensure_shape(emb, static)
        out[i] = emb
    return [out[i] for i in feature_ids], gathered

  @_no_autograph
  def __call__(self, features: Any, weights: Optional[Any] = None) -> Any:
    """Looks features up directly, as `TPUEmbeddingForServing` does.

    `features` may hold any subset of the configured features (by path).
    Differentiable with respect to the tables (plain TensorFlow ops), and it
    never changes a table.
    """
    return self.embedding_lookup(features, weights)

  @_no_autograph
  def embedding_lookup(self, features: Any, weights: Optional[Any] = None):
    self._maybe_build()
    feature_ids, lookups = self._flatten_inputs(features, weights, True)
    batch = self._gather_batch(feature_ids, lookups)
    flat, _ = self._activations(feature_ids, batch, None)
    return nest.pack_sequence_as(features, flat)

  # --- forward and backward: the interface engines offer their users -----

  @_no_autograph
  def forward(self, features, weights=None):
    """Looks up a training batch; returns `(activations, backward)`.

    `activations` has the structure of `feature_config` and TF's output
    shapes. `backward(gradients)` applies the embedding optimizer for this
    batch, given the gradient of the loss with respect to `activations`;
    it may be called once. Nothing is stored on the object, so the Keras
    layer can look up several batches in one step.
    """
    batch = self._prepare(features, weights)
    return self._forward(batch)

  def _prepare(self, features, weights, tpu_rules=False) -> _Batch:
    """Checks the inputs (building on first use) and deduplicates the ids.

    With `tpu_rules` (the TPU protocol's `enqueue`), the shapes follow the
    TPU engine: the inputs' own shapes are checked against the shapes fixed
    by the FeatureConfigs, `build` or the first enqueue, which then shape
    the activations, and they must be fully known: a batch dimension of
    None (e.g. `Dataset.batch` without `drop_remainder=True`) is refused
    here as it would be on a TPU.
    """
    if tpu_rules:
      feature_ids, flat, flat_weights = self._flat_inputs(features, weights,
                                                          False)
      for path, x in zip(self._paths, flat):  # before any shape is fixed
        error = inputs.input_shape_error(path, x)
        if error:
          raise ValueError(error)
      self._maybe_build([inputs.enqueue_output_shape(x, f)
                         for x, f in zip(flat, self._features)])
      self._check_output_shapes_fully_defined()
      feature_ids, lookups = self._lookups(feature_ids, flat, flat_weights,
                                           False, list(self._output_shapes))
      return self._gather_batch(feature_ids, lookups, fused=True)
    feature_ids, lookups = self._flatten_inputs(features, weights, False)
    shapes = [
        inputs.output_shape_from_input(x, f)
        for x, f in zip(nest.flatten(features), self._features)
    ]
    self._maybe_build(shapes)
    return self._gather_batch(feature_ids, lookups, fused=True)

  def _check_output_shapes_fully_defined(self, known_rank_only=False):
    """TF's TPU rule: every feature's activation shape fully known."""
    for path, shape in zip(self._paths, self._output_shapes):
      if known_rank_only and shape.rank is None:
        continue
      if not shape.is_fully_defined():
        raise ValueError(
            f"Input Feature {path} has output shape set as {shape} which is "
            "not fully defined. Please specify the fully defined shape in "
            "either FeatureConfig or for the build method (e.g. batch with "
            "drop_remainder=True), as a TPU requires.")

  def _forward(self, batch: _Batch):
    feature_ids = list(range(len(self._features)))
    flat, rows = self._activations(feature_ids, batch, self._output_shapes)
    applied = []

    def backward(gradients):
      if applied:
        raise RuntimeError(
            "apply_gradients was already called for this batch: call it once "
            "per enqueue.")
      flat_grads = self._check_gradients(gradients)
      applied.append(True)
      self._apply(batch, rows, flat_grads)

    return nest.pack_sequence_as(self._feature_config, flat), backward

  def _apply(self, batch: _Batch, rows, flat_grads):
    """Row gradients per table, then every table's update, then the step.

    Nothing is written before every input and gradient check of the step
    has passed, so a failing check leaves every table and slot as it was.
    """
    checks = list(batch.checks)
    updates = []
    multi_replica = replicas.in_multi_replica_step()
    for t, table_batch in enumerate(batch.tables):
      if table_batch is None:
        continue
      ids = table_batch.unique_ids
      grads, grad_checks, finite = self._row_gradients(t, table_batch, batch,
                                                       flat_grads)
      checks += grad_checks
      w = rows.get(t)
      if multi_replica:  # the global batch's gradient, as the TPU sums it
        ids, grads = replicas.sum_rows_across_replicas(ids, grads)
        w = None
        finite = None  # every replica checks the same, global, gradient
      if finite is None and self._non_finite == "raise":
        # TensorFlow ops: check the summed gradient here.
        finite = validation.finite_gradients(self._table_config[t].name, grads)
      elif finite is None:
        finite = validation.all_finite(grads)
      fused = (self._uses_fused_kernels(t) and kernel_ops.in_place_here(
          self._variables[self._table_config[t].name]))
      updates.append(_TableUpdate(self._table_config[t], ids, w, grads,
                                  finite, fused))

    def write():
      with tf.control_dependencies(checks):
        for u in updates:
          sparse_update.update_table(u.table, self._variables[u.table.name],
                                     u.ids, u.rows, u.grads, fused=u.fused)
        self._advance_learning_rates()
      return tf.constant(True)

    if self._non_finite == "raise":
      for u in updates:  # assert ops, or the raising kernel
        checks += u.finite
      write()
    else:  # "skip": the whole step, for every table, and count it
      finite = tf.reduce_all([u.finite for u in updates])
      tf.cond(finite, write, self._count_skipped_step)

  def _advance_learning_rates(self):
    advanced = []
    for table in self._table_config:
      lr = getattr(table.optimizer, "learning_rate", None)
      if hasattr(lr, "advance") and not any(lr is a for a in advanced):
        lr.advance()
        advanced.append(lr)

  @property
  def non_finite_gradients(self) -> str:
    """What a step with a NaN or Inf embedding gradient does.

    "raise" (default): an InvalidArgumentError naming the table, and no
    table or slot changes. "skip": no table or slot changes, the step is
    counted in `skipped_steps`, and training goes on.
    """
    return self._non_finite

  @non_finite_gradients.setter
  def non_finite_gradients(self, policy: str):
    if policy not in ("raise", "skip"):
      raise ValueError("non_finite_gradients must be 'raise' or 'skip', "
                       f"got {policy!r}.")
    self._non_finite = policy
    if policy == "skip" and self._skipped is None:
      with tf.init_scope(), self._strategy.scope():
        # Aggregation NONE: every replica counts in its own copy (they all
        # see the same global gradient, so they agree).
        self._skipped = data_structures.NoDependency(tf.Variable(
            0, dtype=tf.int64, trainable=False, name="skipped_steps"))

  @property
  def skipped_steps(self) -> int:
    """Steps skipped for non-finite gradients (policy "skip")."""
    return 0 if self._skipped is None else int(self._skipped.numpy())

  def _count_skipped_step(self):
    self._skipped.assign_add(1)
    return tf.constant(False)

  # --- the TPU protocol ---------------------------------------------------

  @_no_autograph
  def enqueue(self, features, weights=None, training: bool = True,
              name: Optional[str] = None, device: Optional[str] = None):
    """Takes a batch of ids, as `TPUEmbedding.enqueue` on a TPU.

    Builds the object on first use (from the inputs' shapes), checks the
    inputs against the shapes fixed by then, and prepares the lookup. The
    next `dequeue` in the same function (or eagerly) returns its activations
    (with `device`, the next `dequeue` of the replica on that device).
    """
    del name
    if device is not None:
      # One replica's batch, given outside strategy.run (e.g. from
      # `experimental_distribute_values_from_function`).
      index = replicas.index_of_device(device, self._strategy)
      with tf.device(device):
        batches = {index: (self._prepare(features, weights, tpu_rules=True),
                           bool(training))}
    elif replicas.is_distributed(features):
      # Outside strategy.run, with a distributed batch: one per replica.
      local = replicas.split((features, weights), self._strategy)
      devices = replicas.local_devices(self._strategy)
      batches = {}
      for i, (device, (f, w)) in enumerate(zip(devices, local)):
        with tf.device(device):
          batches[i] = (self._prepare(f, w, tpu_rules=True), bool(training))
    else:
      batches = {replicas.local_index(): (self._prepare(features, weights,
                                                        tpu_rules=True),
                                          bool(training))}
    key = _graph_key()
    self._enqueued.setdefault(key, {}).update(batches)
    for i in batches:
      self._dequeued.get(key, {}).pop(i, None)

  @_no_autograph
  def dequeue(self, name: Optional[str] = None):
    """Returns the activations of the last `enqueue`, shaped like TF's.

    Under a multi-replica strategy, call it inside `strategy.run`: each
    replica gets the activations of its share of the enqueued batch.
    """
    del name
    if not self._built:
      raise RuntimeError("dequeue called on unbuilt TPUEmbedding object. "
                         "Please either call enqueue first or manually call "
                         "the build method.")
    key, index = _graph_key(), replicas.local_index()
    pending = self._enqueued.get(key, {})
    if index not in pending:
      raise RuntimeError(
          "dequeue called without a preceding enqueue in this function (or "
          "eagerly): call embedding.enqueue(features) first.")
    batch, training = pending.pop(index)
    activations, backward = self._forward(batch)
    if training:
      self._dequeued.setdefault(key, {})[index] = backward
    return activations

  @_no_autograph
  def apply_gradients(self, gradients, name: Optional[str] = None):
    """Updates the rows the last training batch touched.

    `gradients` has the structure of `feature_config`: the gradient of the
    loss with respect to each dequeued activation. A None gradient counts as
    zeros (as on the TPU: rows are still touched, which matters for Adam and
    weight decay).
    """
    del name
    if not self._built:
      raise RuntimeError("apply_gradients called on unbuilt TPUEmbedding "
                         "object. Please either call enqueue first or "
                         "manually call the build method.")
    key, index = _graph_key(), replicas.local_index()
    backward = self._dequeued.get(key, {}).get(index)
    if backward is None:
      self._check_gradients(gradients)  # TF's errors for bad gradients first
      raise RuntimeError(
          "apply_gradients needs a batch enqueued with training=True and "
          "dequeued in this function (or eagerly), and can be called once "
          "per enqueue.")
    backward(gradients)
    del self._dequeued[key][index]

  def _check_gradients(self, gradients):
    self._check_structure(gradients, "gradients")
    flat = []
    for path, grad, shape, feature in zip(self._paths,
                                          nest.flatten(gradients),
                                          self._output_shapes, self._features):
      expected = shape.concatenate([feature.table.dim])
      if grad is None:
        logging.warning(
            "No gradient passed for feature %s, sending zero gradient. This "
            "may not be correct behavior for certain optimizers like Adam.",
            path)
        flat.append(None)
        continue
      if not isinstance(grad, tf.Tensor):  # as TF: no numpy, no lists
        raise ValueError(f"found non-tensor type: {type(grad)} at path {path}.")
      if not grad.dtype.is_floating:
        raise ValueError(f"Gradient at path {path} must be a float tensor, "
                         f"got dtype {grad.dtype.name}.")
      grad = tf.cast(grad, tf.float32)
      if not grad.shape.is_compatible_with(expected):
        raise ValueError("Found gradient of shape {} at path {}. Expected "
                         "shape {}.".format(grad.shape, path, expected))
      flat.append(grad)
    return flat

  def _row_gradients(self, t, table_batch, batch, flat_grads):
    """Sums every id's gradient contribution per distinct row.

    Returns the row gradients, the checks of the gradients' shapes, and,
    from the fused kernel, its finiteness check (None: not checked yet): the
    op that raises for a non-finite gradient (policy "raise"), or whether
    the gradient is finite (policy "skip").
    """
    dim = self._table_config[t].dim
    entry_grads, checks = [], []
    for i in table_batch.features:
      lookup = batch.lookups[i]
      grad = flat_grads[i]
      n = tf.size(lookup.ids)
      if grad is None:
        entry_grads.append(tf.zeros([n, dim], tf.float32))
        continue
      grad = tf.reshape(grad, [-1, dim])
      shape_checks = validation.gradient_rows(self._paths[i], grad,
                                              lookup.num_segments)
      checks += shape_checks
      with tf.control_dependencies(shape_checks):
        grad = tf.identity(grad)
      if lookup.segments is not None:
        grad = tf.gather(grad, lookup.segments)
      if lookup.scales is not None:
        grad = grad * lookup.scales[:, None]
      entry_grads.append(grad)
    if table_batch.fused_positions is not None:
      raising = self._non_finite == "raise"
      row_grads, finite = kernel_ops.row_gradients(
          self._table_config[t], _concat(entry_grads),
          table_batch.fused_positions, table_batch.unique_ids, raising)
      return row_grads, checks, [row_grads] if raising else finite
    return tf.math.unsorted_segment_sum(
        _concat(entry_grads), _concat(table_batch.positions),
        tf.size(table_batch.unique_ids, out_type=tf.int64)), checks, None

def _concat(tensors):
  return tensors[0] if len(tensors) == 1 else tf.concat(tensors, axis=0)


def _quantize(rows, config):
  """Simulated quantization of looked-up rows (QuantizationConfig)."""
  lower, upper = config.lower, config.upper
  quantum = (upper - lower) / (config.num_buckets - 1)
  rows = tf.clip_by_value(rows, lower, upper)
  return tf.floor((rows - lower) / quantum + 0.5) * quantum + lower
