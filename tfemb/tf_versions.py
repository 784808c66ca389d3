"""Where the supported TensorFlow and Keras versions differ, in one place.

tfemb runs on TensorFlow 2.16 to 2.21 (`OLDEST`, `NEWEST`), with Keras 3
from `tfemb.layers.keras_versions.KERAS_MIN` (the Keras side, kept with the
layer: configs and engines import no Keras) or with tf_keras. Its own API
is TensorFlow 2.21's on every one of them. Older releases lack a few of the classes and arguments tfemb
hands to TensorFlow (`ADDED_IN`); the modules that talk to TensorFlow
(`tfemb.tf_conversion`, the TPU delegate, the plan, the proto builder, the
SparseCore host engine) ask this module instead of checking versions.

A configuration that needs what the installed TensorFlow lacks raises
`TensorFlowVersionError`, naming the feature and the version that has it.
"""

import inspect
from typing import Any, Dict

OLDEST = "2.16"
NEWEST = "2.21"
_INSTALL = (
    "`pip install 'tfemb[cpu]'` (tensorflow-cpu), `pip install "
    "'tfemb[tensorflow]'` (tensorflow and tf-keras), or your platform's own "
    "build (e.g. tensorflow-tpu on a TPU VM)")

try:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
except ModuleNotFoundError as error:
  if error.name != "tensorflow":
    raise
  raise ImportError(
      f"tfemb needs TensorFlow {OLDEST} to {NEWEST}, and none is installed: "
      f"{_INSTALL}.") from error


def version_tuple(version: str):
  return tuple(int(part) for part in version.split(".")[:3]
               if part.isdigit())


if version_tuple(tf.__version__) < version_tuple(OLDEST):
  raise ImportError(
      f"tfemb needs TensorFlow {OLDEST} to {NEWEST}; the installed "
      f"TensorFlow is {tf.__version__}: {_INSTALL}.")

_EMBEDDING = tf.tpu.experimental.embedding

# The TensorFlow release that added each class or constructor argument of
# `tf.tpu.experimental.embedding` that tfemb may need, read from each
# release's `tpu_embedding_v2_utils.py` and `tpu_embedding_v3.py`; and the
# one that added the SparseCore table stacker (`_pywrap_sparse_core_layout`).
# Everything else is in all supported releases.
ADDED_IN = {
    "SparseCoreEmbeddingConfig": "2.17",
    "SparseCoreEmbeddingConfig.initialize_tables_on_host": "2.18",
    "SparseCoreEmbeddingConfig.enable_fast_table_initialization": "2.18",
    "TPUEmbeddingV2.sparse_core_embedding_config": "2.17",
    "CustomOptimizer": "2.18",
    "CustomOptimizer.slot_dims": "2.21",
    "CustomCombiner": "2.20",
    "TableConfig.dtype": "2.20",
}
STACKER = "SparseCore table stacking (_pywrap_sparse_core_layout)"
STACKER_ADDED_IN = "2.17"


def at_least(version: str) -> bool:
  """Whether the installed TensorFlow is `version` (e.g. "2.17") or newer."""
  return version_tuple(tf.__version__)[:2] >= version_tuple(version)


def missing_here():
  """The `ADDED_IN` entries the installed TensorFlow lacks (none on 2.21)."""
  return {k for k, v in ADDED_IN.items() if not at_least(v)}


class TensorFlowVersionError(ValueError):
  """A configuration needs a TensorFlow newer than the installed one."""


def version_error(what: str, feature: str,
                  since: str = "") -> TensorFlowVersionError:
  return TensorFlowVersionError(
      f"{what} needs {feature}, which TensorFlow has from version "
      f"{since or ADDED_IN[feature]} on; the installed TensorFlow is "
      f"{tf.__version__} (tfemb supports {OLDEST} to {NEWEST}).")


def _parameters(cls) -> Dict[str, inspect.Parameter]:
  return dict(inspect.signature(cls.__init__).parameters)


def newest_class(name: str):
  """TensorFlow's `tf.tpu.experimental.embedding.<name>` where it has 2.21's
  constructor arguments here, else None (tfemb then has its own class)."""
  cls = getattr(_EMBEDDING, name, None)
  prefix = f"{name}."
  added = {k[len(prefix):] for k in ADDED_IN if k.startswith(prefix)}
  if cls is None or not added <= set(_parameters(cls)):
    return None
  return cls


def tensorflow_class(name: str, what: str):
  """`tf.tpu.experimental.embedding.<name>`, or a version error for `what`."""
  cls = getattr(_EMBEDDING, name, None)
  if cls is None:
    raise version_error(what, name)
  return cls


def _is_default(value: Any, default: Any) -> bool:
  try:
    return value is default or bool(value == default)
  except (TypeError, ValueError):  # e.g. an array's ambiguous truth value
    return False


def construct(cls, kwargs: Dict[str, Any], what: str, reference=None,
              positional: bool = False):
  """`cls(**kwargs)` with the arguments this TensorFlow's `cls` accepts.

  An argument it lacks is dropped where its value is the default of
  `reference` (the same class as in TensorFlow 2.21; default: `cls`'s own
  defaults, so only a None is dropped); otherwise the conversion would
  lose it, and this raises: a version error where `ADDED_IN` knows the
  argument, else a ValueError naming it. `positional`: passes the kept
  arguments in order (TensorFlow's engines, as its own callers do).
  """
  accepted = _parameters(cls)
  if any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
         for p in accepted.values()):
    accepted = kwargs  # takes anything
  defaults = _parameters(reference) if reference is not None else {}
  for name, value in kwargs.items():
    if name in accepted:
      continue
    default = defaults[name].default if name in defaults else None
    if _is_default(value, default):
      continue
    feature = f"{cls.__name__}.{name}"
    if feature in ADDED_IN:
      raise version_error(f"{what} ({name}={value!r})", feature)
    raise ValueError(
        f"{what}: this TensorFlow's {cls.__name__} has no argument "
        f"{name!r} (value {value!r}); it cannot be converted losslessly.")
  kept = {k: v for k, v in kwargs.items() if k in accepted}
  return cls(*kept.values()) if positional else cls(**kept)


def sparse_core_layout(what: str):
  """TensorFlow's SparseCore table stacker module, or a version error."""
  try:
    from tensorflow.python.tpu import _pywrap_sparse_core_layout  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  except ImportError:
    raise version_error(what, STACKER, STACKER_ADDED_IN)  # pylint: disable=raise-missing-from
  return _pywrap_sparse_core_layout
