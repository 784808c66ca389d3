"""Inference exports: each table's parameters once, TensorFlow's ops only.

`export_for_serving(model_or_embedding, path)` writes a SavedModel for
TF Serving from a Keras model with `tfemb.layers.TPUEmbedding` (Keras 3 or
tf_keras) or from a host `tfemb.TPUEmbedding`. Keras 3's `model.export`
writes the same artifact. Either way:

* every table is one `[vocabulary_size, dim]` variable holding its
  parameters (float32, or bfloat16 when asked); no optimizer slot, no
  interleaved storage (`tfemb.interleaved_tables`);
* the serving function looks ids up with TensorFlow's ops (`tf.unique`,
  `tf.gather`, segment sums), with the numbers of `model.predict`, at any
  batch size, so the artifact loads where tfemb is not installed;
* the model is not changed: the export never runs the training engine.

How the tables get into the file without a copy: while an export traces
the model, the layer looks its ids up in a `ServingTable` per table, a
variable that holds no memory in this process. When the SavedModel is
written, each one hands the saver the current parameters of its table (cast
to the export's dtype), so the file holds them under the serving variable.

`tf.saved_model.save` of a whole model (and tf_keras' SavedModel
`model.save`) keeps the full state for resuming training; its functions use
the same TensorFlow-only lookup on the live tables.
"""

import contextlib
import sys
import threading
import weakref
from typing import Any, Dict, Optional

import tensorflow as tf
from tensorflow.python.distribute import sharded_variable  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.saved_model import save_context  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import base as trackable
from tensorflow.python.training.saving import saveable_object  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb.host import feeding
from tfemb.host import step
from tfemb.host import tables as table_paths

TABLE_DTYPES = (tf.float32, tf.bfloat16)
_state = threading.local()


class ServingTable(resource_variable_ops.UninitializedVariable):
  """A table's parameters as the export writes them: `[rows, dim]` of
  `dtype`. It allocates nothing here; a SavedModel save reads `source` (the
  live parameters, a plain variable or an interleaved table's view) when it
  writes the file, and loads as a plain variable."""

  def __init__(self, source: tf.Variable, name: str, dtype: tf.DType):
    super().__init__(shape=source.shape, dtype=dtype, trainable=False,
                     name=name)
    self._source = source

  def _serialize_to_tensors(self):
    source, dtype = self._source, self.dtype

    def value():  # read when the save writes, not when it is planned
      # A view reads its columns without a copy of its storage.
      saved = getattr(source, "_saved_value", source.read_value)()
      return saved if saved.dtype == dtype else tf.cast(saved, dtype)

    spec = saveable_object.SaveSpec(value, "", trackable.VARIABLE_VALUE_KEY,
                                    dtype=dtype, device=source.device)
    return {trackable.VARIABLE_VALUE_KEY: spec}


class _ServingPath(table_paths.OpsTable):
  """The direct lookup path, its rows in float32 whatever the table's
  dtype (a bfloat16 table is combined in float32)."""

  def feature_rows(self, batch):
    return super().feature_rows(
        batch._replace(rows=tf.cast(batch.rows, tf.float32)))


def lookup(config, tables: Dict[str, tf.Variable], features, weights=None):
  """The activations of `model.predict`, by TensorFlow's ops.

  Args:
    config: the engine's resolved configuration (`tfemb.resolution`).
    tables: the parameters, by table name.
    features: the structure of `feature_config`; any batch size.
    weights: None or per-id weights, as the engine takes them.
  """
  feature_ids, flat, flat_weights = feeding.flat_inputs(config, features,
                                                        weights, False)
  lookups = feeding.lookups(config, feature_ids, flat, flat_weights, False)
  paths = [_ServingPath(t, {"parameters": tables[t.name]})
           for t in config.tables]
  batch = step.gather(config, paths, feature_ids, lookups)
  activations = step.activations(config, batch, feature_ids)
  return nest.pack_sequence_as(config.structure, activations)


def _check_exportable(engine):
  if not engine._built:  # pylint: disable=protected-access
    raise ValueError(
        "The embedding tables do not exist yet, so there is nothing to "
        "export: call the model (or the embedding) on one batch, or fit or "
        "restore it, before exporting.")
  for table, variable in zip(engine._config.tables,  # pylint: disable=protected-access
                             _parameters(engine).values()):
    if isinstance(variable, sharded_variable.ShardedVariable):
      raise ValueError(
          f"Table {table.name!r} is sharded over parameter servers, which an "
          "inference export cannot write as one variable. Save a checkpoint "
          "(tf.train.Checkpoint), restore it into the same model built "
          "without ParameterServerStrategy (or into "
          "tfemb.TPUEmbeddingForServing), and export that.")


def _parameters(engine) -> Dict[str, tf.Variable]:
  return {t.name: engine._variables[t.name]["parameters"]  # pylint: disable=protected-access
          for t in engine._config.tables}  # pylint: disable=protected-access


class _Export:
  """One export: its tables' dtype and the `ServingTable`s made so far,
  by engine, so that every trace of this export reads the same ones."""

  def __init__(self, dtype):
    self.dtype = dtype
    self.tables = {}

  def tables_of(self, engine):
    if id(engine) not in self.tables:
      self.tables[id(engine)] = (engine, {
          name: ServingTable(variable, name, self.dtype)
          for name, variable in _parameters(engine).items()})
    return self.tables[id(engine)][1]


# Keras' exports in progress, by their `ExportArchive`.
_keras_exports = weakref.WeakKeyDictionary()
_KERAS_EXPORT = ("keras.src.export", "tf_keras.src.export")


def _keras_export() -> Optional[_Export]:
  """The export of Keras' `model.export` (or `ExportArchive`) tracing
  the model now, or None: Keras offers no hook, so the caller's frames
  tell, and the archive keys its tables (it traces more than once)."""
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    archive = frame.f_locals.get("self")
    if (frame.f_globals.get("__name__", "").startswith(_KERAS_EXPORT) and
        hasattr(archive, "write_out")):
      if archive not in _keras_exports:
        _keras_exports[archive] = _Export(tf.float32)
      return _keras_exports[archive]
    frame = frame.f_back
  return None


def tables_for(engine) -> Optional[Dict[str, tf.Variable]]:
  """The tables a lookup traced now reads for an export, or None when this
  is no export (the engine's own path then).

  In an inference export (`export_for_serving`, Keras 3's `export`): one
  `ServingTable` per table, the same ones for every trace of the export.
  Under a plain `tf.saved_model.save`: the live parameters, which that
  save writes anyway with the rest of the model's state.
  """
  export = getattr(_state, "export", None)
  if export is None and tf.inside_function():
    export = _keras_export()
  if export is not None:
    _check_exportable(engine)
    return export.tables_of(engine)
  if save_context.in_save_context():
    _check_exportable(engine)
    return _parameters(engine)
  return None


@contextlib.contextmanager
def _exporting(dtype):
  _state.export = _Export(dtype)
  try:
    yield
  finally:
    _state.export = None


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
  if isinstance(model_or_embedding, host_engine.HostEmbedding):
    embedding = model_or_embedding
    embedding._maybe_build()  # pylint: disable=protected-access
    if input_signature is None:
      input_signature = tf.nest.map_structure(
          lambda f: tf.TensorSpec([None], tf.int64),
          embedding._config.structure)  # pylint: disable=protected-access

    def serve(features):
      return lookup(embedding._config, tables_for(embedding), features)  # pylint: disable=protected-access
    return serve, input_signature
  if not hasattr(model_or_embedding, "layers"):
    raise TypeError(
        "export_for_serving takes a Keras model with tfemb.layers."
        "TPUEmbedding or a tfemb.TPUEmbedding created off the TPU, got "
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
  with _exporting(table_dtype):
    concrete = serve.get_concrete_function()
    if all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(signature)):
      signatures = {"serving_default": _flat_outputs(serve, signature)}
    root = tf.Module()
    # The variables the function reads: tables once, dense layers; no slot.
    root.serving_variables = list(concrete.variables)
    root.serve = serve
    # In the scope: the save traces the function again.
    tf.saved_model.save(root, path, signatures=signatures)


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
