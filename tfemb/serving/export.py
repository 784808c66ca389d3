"""Inference exports: each table's parameters once, TensorFlow's ops only.

`export_for_serving(model_or_embedding, path)` writes a SavedModel for
TF Serving from a Keras model with `tfemb.layers.TPUEmbedding` (Keras 3 or
tf_keras; either generation, under any non-TPU strategy) or from a host
`tfemb.TPUEmbedding` or `tfemb.TPUEmbeddingV2`. Keras' `model.export`
writes the same artifact. Either way:

* every table is one `[vocabulary_size, dim]` variable holding its
  parameters (float32, or bfloat16 when asked); no optimizer slot, no
  interleaved storage (`tfemb.interleaved_tables`), no SparseCore stacking
  (`tfemb.serving.sparsecore_export`), one copy whatever the number of
  replicas;
* the serving function looks ids up with TensorFlow's ops (`tf.unique`,
  `tf.gather`, segment sums), with the numbers of `model.predict`, at any
  batch size, so the artifact loads where tfemb is not installed;
* the model is not changed: the export never runs the training engine.

How the tables get into the file without a copy: while an export traces
the model, the layer looks its ids up in a `ServingTable` per table, a
variable that holds no memory in this process. When the SavedModel is
written, each one hands the saver the current parameters of its table (cast
to the export's dtype), so the file holds them under the serving variable.
A float32 table is read without a copy. A table that needs one (unstacked
from a SparseCore stack, or cast to bfloat16) is computed when the saver
writes it; `export_for_serving` gives each table a data file of its own,
written one after the other, so one such copy exists at a time (Keras'
`model.export` writes one data file: all of them at once).

`tf.saved_model.save` of a whole model (and tf_keras' SavedModel
`model.save`) keeps the full state for resuming training; its functions use
the same TensorFlow-only lookup on the live tables.

When a lookup is traced for a SavedModel (`saving`): inside `exporting`
(an inference export: `export_for_serving`, or Keras' `model.export` as
`tfemb.serving.keras_export` recognises it), or inside TensorFlow's
SavedModel save (a full save). Otherwise the engines look up as they
train, and nothing here runs.
"""

import contextlib
import threading
from typing import Any, Dict, Iterator, List, Optional

import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.saved_model import save_context  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import base as trackable
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import input_dtypes
from tfemb import variable_view
from tfemb.host import feeding
from tfemb.host import step
from tfemb.host import table_paths
from tfemb.serving import sparsecore_export

TABLE_DTYPES = (tf.float32, tf.bfloat16)


class _State(threading.local):
  """What a thread has in progress: its exports, innermost last."""

  def __init__(self):
    super().__init__()
    self.exports: List["Export"] = []


_state = _State()


class ServingTable(resource_variable_ops.UninitializedVariable):
  """A table's parameters as the export writes them: `[rows, dim]` of
  `dtype`. It allocates nothing here; a SavedModel save reads `source` (the
  live parameters: a plain variable, an interleaved table's `ColumnView` or
  a stacked table's `UnstackedTable`) when it writes the file, and loads as a
  plain variable."""

  def __init__(self, source: tf.Variable, name: str, dtype: tf.DType):
    super().__init__(shape=source.shape, dtype=dtype, trainable=False,
                     name=name)
    self._source = source

  def _serialize_to_tensors(self):
    source, dtype = self._source, self.dtype

    def value():  # read when the save writes, not when it is planned
      # A view reads its columns without a copy of its storage; a stacked
      # table, its rows and columns (`tfemb.serving.sparsecore_export`).
      read = (source.saved_value
              if isinstance(source, variable_view.SavedValue) else
              source.read_value)
      saved = read()
      return saved if saved.dtype == dtype else tf.cast(saved, dtype)

    deferred = _Deferred(value, self.shape, dtype, source.device)
    spec = saveable_object.SaveSpec(lambda: deferred, "",
                                    trackable.VARIABLE_VALUE_KEY,
                                    dtype=dtype, device=source.device)
    return {trackable.VARIABLE_VALUE_KEY: spec}


class _Deferred:
  """A table's value for the saver, computed only when the save op of its
  shard takes it: with `_TablePerShard`, a copy of a table (unstacked, or
  cast to bfloat16) exists for one table at a time."""

  def __init__(self, compute, shape, dtype, device):
    self._compute = compute
    self.shape, self.dtype, self.device = shape, dtype, device

  def __tf_tensor__(self, dtype=None, name=None):
    del dtype, name
    return self._compute()


class _TablePerShard(getattr(tf.train.experimental, "ShardingCallback",
                             object)):
  """The saver's sharding: each `ServingTable` in a data file of its own,
  everything else in one. The saver writes shard after shard."""

  @property
  def description(self) -> str:
    return "tfemb: one shard per table of an inference export"

  def __call__(self, shardable_tensors):
    shared, own = {}, []
    for t in shardable_tensors:
      if isinstance(t.tensor, _Deferred):
        own.append({t.checkpoint_key: {t.slice_spec: t.tensor}})
      else:
        shared.setdefault(t.checkpoint_key, {})[t.slice_spec] = t.tensor
    return ([shared] if shared else []) + own


def _save_options():
  """Each table in a shard of its own, where TensorFlow's saver takes a
  sharding callback (2.16 on); else the saver's one shard."""
  try:
    return tf.saved_model.SaveOptions(
        experimental_sharding_callback=_TablePerShard())
  except (TypeError, ValueError):
    return None


class _ServingPath(table_paths.OpsTable):
  """The direct lookup path, its rows in float32 whatever the table's
  dtype (a bfloat16 table is combined in float32), and only the table's
  columns of a stacked variable."""

  def feature_rows(self, batch):
    rows = tf.cast(batch.rows, tf.float32)
    if rows.shape[-1] != self.table.dim:
      rows = rows[:, :self.table.dim]
    return super().feature_rows(batch._replace(rows=rows))


def lookup(config, tables: Dict[str, tf.Variable], features, weights=None,
           remaps=None):
  """The activations of `model.predict`, by TensorFlow's ops.

  Args:
    config: the engine's resolved configuration (`tfemb.resolution`).
    tables: the parameters, by table name.
    features: the structure of `feature_config`; any batch size.
    weights: None or per-id weights, as the engine takes them.
    remaps: None, or by table name where its ids sit in a stacked
      variable (`tfemb.host.table_paths.Remap`).
  """
  feature_ids, flat, flat_weights = feeding.flat_inputs(config, features,
                                                        weights, False)
  # Cast as the trained model's lookup casts (a stacked engine's inputs come
  # cast to int32 already, by `sparsecore_export.serving_inputs`).
  lookups = feeding.lookups(config, feature_ids, flat, flat_weights,
                            input_dtypes.V1, False)
  remaps = remaps or {}
  paths = [_ServingPath(t, {"parameters": tables[t.name]}, remaps.get(t.name))
           for t in config.tables]
  batch = step.gather(config, paths, feature_ids, lookups)
  activations = step.activations(config, batch, feature_ids)
  return nest.pack_sequence_as(config.structure, activations)


def _check_exportable(engine):
  if not engine.built:
    raise ValueError(
        "The embedding tables do not exist yet, so there is nothing to "
        "export: call the model (or the embedding) on one batch, or fit or "
        "restore it, before exporting.")
  for name, variable in _parameters(engine).items():
    if isinstance(variable, sharded_variable.ShardedVariable):
      raise ValueError(
          f"Table {name!r} is sharded over parameter servers, which an "
          "inference export cannot write as one variable. Save a checkpoint "
          "(tf.train.Checkpoint), restore it into the same model built "
          "without ParameterServerStrategy (or into "
          "tfemb.TPUEmbeddingForServing), and export that.")


def _parameters(engine) -> Dict[str, tf.Variable]:
  """Each user table's live parameters, by name (a stacked engine's: each
  table's own variable)."""
  if sparsecore_export.is_stacked(engine):
    return {name: variables["parameters"]
            for name, (variables, _) in engine.own_tables().items()}
  variables = engine.variables
  return {t.name: variables[t.name]["parameters"]
          for t in engine.resolved_config.tables}


def _sources(engine) -> Dict[str, Any]:
  """What an inference export writes of each table, by table name."""
  if sparsecore_export.is_stacked(engine):
    return sparsecore_export.unstacked(engine)
  return _parameters(engine)


class Export:
  """One inference export: its tables' dtype and the `ServingTable`s made
  so far, by engine, so that every trace of this export reads the same
  ones."""

  def __init__(self, dtype: tf.DType):
    self.dtype = dtype
    self.tables = {}

  def tables_of(self, engine) -> Dict[str, ServingTable]:
    if id(engine) not in self.tables:
      self.tables[id(engine)] = (engine, {
          name: ServingTable(variable, name, self.dtype)
          for name, variable in _sources(engine).items()})
    return self.tables[id(engine)][1]


def _exports() -> List[Export]:
  return _state.exports


@contextlib.contextmanager
def exporting(export: Export) -> Iterator[Export]:
  """Lookups traced in this thread inside the block are traced for
  `export`: they read its `ServingTable`s (the innermost export's)."""
  _exports().append(export)
  try:
    yield export
  finally:
    _exports().pop()


def current_export() -> Optional[Export]:
  """The innermost export in progress in this thread, or None."""
  exports = _exports()
  return exports[-1] if exports else None


def saving() -> bool:
  """Whether a lookup traced now is traced for a SavedModel: an inference
  export (`exporting`) or TensorFlow's SavedModel save (a full save)."""
  return bool(_exports()) or save_context.in_save_context()


def serving_activations(engine, features, weights=None):
  """The activations of a lookup traced for a SavedModel (when `saving()`),
  by TensorFlow's ops.

  In an inference export (`export_for_serving`, Keras' `model.export`) the
  lookup reads one `ServingTable` per table, the same ones for every trace
  of the export. Under a plain `tf.saved_model.save` it reads the live
  parameters, which that save writes anyway with the rest of the model's
  state. A host `TPUEmbeddingV2`'s stacked tables:
  `tfemb.serving.sparsecore_export`.
  """
  export = current_export()
  _check_exportable(engine)
  config, remaps = engine.resolved_config, None
  if sparsecore_export.is_stacked(engine):
    features, weights = sparsecore_export.serving_inputs(config, features,
                                                      weights)
    config = sparsecore_export.serving_config(config)
  if export is not None:
    tables = export.tables_of(engine)
  elif sparsecore_export.is_stacked(engine):
    tables, remaps = sparsecore_export.stacked(engine)
  else:
    tables = _parameters(engine)
  return lookup(config, tables, features, weights, remaps)


def _input_spec(x):
  """A Keras input's spec, with any batch size."""
  shape = [None] + list(x.shape)[1:]
  dtype = tf.as_dtype(x.dtype)
  spec = getattr(x, "type_spec", None)  # tf_keras
  if isinstance(spec, tf.RaggedTensorSpec) or getattr(x, "ragged", False):
    return tf.RaggedTensorSpec(
        shape, dtype, ragged_rank=getattr(spec, "ragged_rank", 1),
        row_splits_dtype=getattr(spec, "row_splits_dtype", tf.int64))
  if isinstance(spec, tf.SparseTensorSpec) or getattr(x, "sparse", False):
    return tf.SparseTensorSpec(shape, dtype)
  return tf.TensorSpec(shape, dtype)


def _keras_input_signature(model):
  try:
    inputs = model.input
  except (AttributeError, ValueError):
    inputs = None
  if inputs is None:
    raise ValueError(
        "The model has no known inputs (a subclassed model): pass "
        "input_signature, e.g. {'ids': tf.TensorSpec([None], tf.int64)}.")
  return tf.nest.map_structure(_input_spec, inputs)


def _serving_function(model_or_embedding, input_signature):
  """(the function to export, its input signature)."""
  from tfemb.host import engine as host_engine  # pylint: disable=g-import-not-at-top
  if (isinstance(model_or_embedding, host_engine.HostEmbedding) or
      sparsecore_export.is_stacked(model_or_embedding)):
    embedding = model_or_embedding
    if not embedding.built:
      embedding.build()
    if input_signature is None:
      input_signature = tf.nest.map_structure(
          lambda f: tf.TensorSpec([None], tf.int64),
          embedding.resolved_config.structure)

    def serve(features):
      return serving_activations(embedding, features)
    return serve, input_signature
  if not hasattr(model_or_embedding, "layers"):
    raise TypeError(
        "export_for_serving takes a Keras model with tfemb.layers."
        "TPUEmbedding, or a tfemb.TPUEmbedding or tfemb.TPUEmbeddingV2 "
        "created off the TPU, got "
        f"{type(model_or_embedding).__name__}.")
  model = model_or_embedding
  if input_signature is None:
    input_signature = _keras_input_signature(model)
  return (lambda features: model(features, training=False)), input_signature


def export_for_serving(model_or_embedding: Any, path: str,
                       table_dtype: tf.DType = tf.float32,
                       input_signature: Any = None) -> None:
  """Writes an inference SavedModel: `serve` and `serving_default`.

  Args:
    model_or_embedding: a Keras model (Keras 3 or tf_keras) holding
      `tfemb.layers.TPUEmbedding` layers, or a `tfemb.TPUEmbedding` created
      off the TPU (its `serve(features)` returns the activations).
    path: the SavedModel's directory (for TF Serving, `<model>/<version>`).
    table_dtype: `tf.float32`, or `tf.bfloat16` for tables of half the
      bytes (activations within bfloat16's rounding of float32's).
    input_signature: the features' specs (any batch size: None). Default:
      the model's inputs, or dense int64 ids of shape [None] per feature of
      an embedding.
  """
  table_dtype = tf.as_dtype(table_dtype)
  if table_dtype not in TABLE_DTYPES:
    raise ValueError(f"table_dtype must be tf.float32 or tf.bfloat16, got "
                     f"{table_dtype.name}.")
  fn, signature = _serving_function(model_or_embedding, input_signature)
  serve = tf.function(fn, input_signature=[signature], autograph=False)
  signatures = None
  with exporting(Export(table_dtype)):
    concrete = serve.get_concrete_function()
    if all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(signature)):
      signatures = {"serving_default": _flat_outputs(serve, signature)}
    root = tf.Module()
    # The variables the function reads: tables once, dense layers; no slot.
    root.serving_variables = list(concrete.variables)
    root.serve = serve
    # In the scope: the save traces the function again.
    tf.saved_model.save(root, path, signatures=signatures,
                        options=_save_options())


def _flat_outputs(serve, signature):
  """A signature function: named dense inputs, a dict of outputs."""
  paths = [p for p, _ in nest.flatten_with_joined_string_paths(signature)]
  flat_specs = [tf.TensorSpec(s.shape, s.dtype, name=p.replace("/", "_"))
                for p, s in zip(paths, tf.nest.flatten(signature))]

  @tf.function(input_signature=flat_specs, autograph=False)
  def signature_fn(*flat):
    out = serve(tf.nest.pack_sequence_as(signature, list(flat)))
    if isinstance(out, tf.Tensor):
      return {"output_0": out}
    return {p.replace("/", "_"): t
            for p, t in nest.flatten_with_joined_string_paths(out)}

  return signature_fn.get_concrete_function()
