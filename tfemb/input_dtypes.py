"""Ids and weights of other dtypes, as each of TensorFlow's engines takes
them (docs/numerics.md, "Input dtypes").

TensorFlow 2.21's engines differ where a batch comes in:

* `TPUEmbedding.enqueue` (embedding hardware V1, `tpu_embedding_v2.py`'s
  `_add_data_for_tensor` and its sparse and ragged siblings) casts every
  feature's ids to int64 and its weights to float32: `V1`;
* `TPUEmbeddingV2` (SparseCore, `tpu_embedding_v3.py`'s
  `_convert_input_feature_to_list_of_coo_tensors`, which its lookup,
  `enqueue` and `compute_sparse_core_stats` share) casts ids to int32 and
  weights to float32: `V2`;
* `TPUEmbeddingForServing` (`tpu_embedding_for_serving.py`) and
  `TPUEmbeddingV0` (`tpu_embedding_v1.py`) cast nothing: they gather rows
  with the ids, which takes int32 or int64 only, and multiply the rows by
  the weights, which takes the tables' float32 only. Anything else fails
  in those ops, with their words as TensorFlow builds them in a function
  (where a TPU step and a serving signature trace them): `SERVING`, `V0`.

A cast is `tf.cast`'s, as on the TPU host that casts for the TPU: floats
truncate toward zero, an int64 id keeps its low 32 bits in int32 (2^32 + 3
becomes 3, 2^31 becomes -2^31), and NaN, infinities and floats out of range
become the integer's minimum. What a cast makes of an id is then checked
against the table as any id is. Only strings cannot be cast; the refusal is
TensorFlow's Cast op's ("Cast string to int64 is not supported"), naming
the feature, before anything is looked up.
"""

import dataclasses
from typing import Any, Optional

import tensorflow as tf

_LOOKUP_IDS = (tf.int32, tf.int64)  # what a gather takes
_TABLE_DTYPE = tf.float32


class DtypeError(TypeError, ValueError):
  """Ids or weights of a dtype a lookup does not take. Both a TypeError and
  a ValueError: TensorFlow raises either, by input kind (a gather's dtype
  check, a RaggedTensor lookup's, a product's), so code written against
  TensorFlow catches it."""

  # Inside tf.function, autograph re-raises an error of a type it can build
  # from the message alone (this test) and wraps any other in a StagingError.
  __init__ = Exception.__init__


class CastError(tf.errors.UnimplementedError, TypeError):
  """Ids or weights that TensorFlow's Cast op cannot cast (strings): its
  UnimplementedError (and a TypeError), raised when the step is built.
  Made as TensorFlow's errors are, `CastError(None, None, message)`, so that
  autograph re-raises it as it is from a function's trace."""


def _cpp_name(dtype: tf.DType) -> str:
  """The dtype as TensorFlow's kernels name it (float32 is "float")."""
  return {tf.float32: "float", tf.float64: "double"}.get(dtype, dtype.name)


@dataclasses.dataclass(frozen=True)
class InputDtypes:
  """What one engine's entry point does with a feature's ids and weights.

  Attributes:
    name: the engine, for the docs and errors.
    ids: the dtype the ids are cast to; None: taken as int32 or int64 only.
    weights: the dtype the weights are cast to; None: taken as float32 only.
    ragged_lookup: a RaggedTensor's ids are refused as a ragged lookup
      refuses them (the serving class looks them up ragged; V0 makes them
      dense first, and refuses them as a gather does).
    sparse_weights_as_table: a SparseTensor's weights are refused as a
      sparse lookup converts them to the table's dtype (the serving class);
      else as the product of rows and weights refuses them.
  """
  name: str
  ids: Optional[tf.DType] = None
  weights: Optional[tf.DType] = None
  ragged_lookup: bool = False
  sparse_weights_as_table: bool = False

  def cast_ids(self, where: str, x: Any, kind: str) -> Any:
    """`x` (a Tensor, SparseTensor or RaggedTensor) as the engine takes
    it; `where` names the feature in a refusal."""
    if self.ids is not None:
      return _cast(where, x, self.ids)
    if x.dtype in _LOOKUP_IDS:
      return x
    if kind == "ragged" and self.ragged_lookup:
      raise DtypeError(
          f"{where}: The values contained by the inputs have type "
          f"{x.dtype} and cannot be processed. All values should be "
          "indices, either of type `int32` or `int64`.")
    raise DtypeError(
        f"{where}: Value passed to parameter 'indices' has DataType "
        f"{x.dtype.name} not in list of allowed values: int32, int64")

  def deferred_id_cast(self, where: str, x: Any) -> Optional[tf.DType]:
    """The dtype `cast_ids` would cast `x` to, where it would cast it
    (None: it takes `x` as it is); refuses `x` as `cast_ids` does. For ids
    cast later, after every replica's are joined (`inputs.to_lookup`)."""
    if self.ids is None or x.dtype == self.ids:
      self.cast_ids(where, x, "dense")  # its refusal, if any
      return None
    _castable(where, x.dtype, self.ids)
    return self.ids

  def cast_weights(self, where: str, w: Any, kind: str) -> Any:
    """`w`, per-id weights of ids of `kind`, as the engine takes them."""
    if self.weights is not None:
      return _cast(where, w, self.weights)
    if w.dtype == _TABLE_DTYPE:
      return w
    if kind == "sparse" and self.sparse_weights_as_table:
      raise DtypeError(
          f"{where}: Incompatible type conversion requested to type "
          f"{w.dtype.name} for `tf.Variable of type float32.")
    raise DtypeError(
        f"{where}: Input 'y' of 'Mul' Op has type {w.dtype.name} that does "
        "not match type float32 of argument 'x'.")


def _castable(where: str, source: tf.DType, dtype: tf.DType) -> None:
  if source == tf.string:
    raise CastError(None, None, f"{where}: Cast string to {_cpp_name(dtype)} "
                    "is not supported")


def _cast(where: str, x: Any, dtype: tf.DType) -> Any:
  _castable(where, x.dtype, dtype)
  return tf.cast(x, dtype)


V1 = InputDtypes("TPUEmbedding", ids=tf.int64, weights=tf.float32)
V2 = InputDtypes("TPUEmbeddingV2", ids=tf.int32, weights=tf.float32)
SERVING = InputDtypes("TPUEmbeddingForServing", ragged_lookup=True,
                      sparse_weights_as_table=True)
V0 = InputDtypes("TPUEmbeddingV0")
