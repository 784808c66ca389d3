"""Running a TPU codebase unchanged off the TPU: `tfemb.patch()`.

The patch routes the engine classes of `tf.tpu.experimental.embedding`
(`TPUEmbedding`, `TPUEmbeddingV2`, `TPUEmbeddingV0`) and the Keras layers of
tensorflow-recommenders (`tfrs.layers.embedding.TPUEmbedding`) to tfemb's:
every module attribute that holds one of those classes, including the
aliases other modules made when they imported it (`from ... import
TPUEmbedding`), is set to tfemb's class; `undo()` puts each one back.
Patches nest: the names stay routed until every patch is undone.
Under a `TPUStrategy`, tfemb's classes hand the work to TensorFlow's own
(docs/tpu.md), so a patched program still runs TensorFlow's engines on a
TPU. What the patch does not reach: a class object a program stored
elsewhere than in a module attribute (a list, a closure) before the patch.

    import tfemb
    tfemb.patch()                  # or: with tfemb.patch(): ...
    import my_tpu_training_script  # runs on the CPU with the TPU's numbers

`python -m tfemb.run script.py ARGS...` does the same for a script
(`tfemb.run`).
"""

import importlib
import importlib.util
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple


from tfemb.mid_level import TPUEmbedding
from tfemb.sparsecore.engine import TPUEmbeddingV2
from tfemb.tpu import delegate
from tfemb.tpu.tensorflow_classes import TENSORFLOW_ENGINES
from tfemb.v0 import TPUEmbeddingV0

# tfemb's engine for each of TensorFlow's (`TENSORFLOW_ENGINES`).
_ENGINES = {"TPUEmbedding": TPUEmbedding, "TPUEmbeddingV2": TPUEmbeddingV2,
            "TPUEmbeddingV0": TPUEmbeddingV0}

_LOCK = threading.Lock()
_ACTIVE: List["Patch"] = []  # patches not undone, outermost first
_CHANGED: List[Tuple[Any, str, Any]] = []  # (module, name, original)


def _replacements() -> Dict[int, Tuple[Any, Any]]:
  """{id(original): (original, replacement)} for what is installed here."""
  # The Keras layer on first use: `import tfemb` does not load Keras.
  import tfemb.layers  # pylint: disable=g-import-not-at-top
  pairs = [(TENSORFLOW_ENGINES[name], _ENGINES[name])
           for name in TENSORFLOW_ENGINES]
  layer = _tfrs_layer()
  if layer is not None:
    pairs.append((layer, tfemb.layers.TPUEmbedding))
  return {id(original): (original, ours) for original, ours in pairs}


def _tfrs_layer() -> Optional[type]:
  """tensorflow-recommenders' Keras layer, if tfrs is installed and loads
  with this Keras (it needs tf_keras)."""
  if importlib.util.find_spec("tensorflow_recommenders") is None:
    return None
  try:
    module = importlib.import_module(
        "tensorflow_recommenders.layers.embedding.tpu_embedding_layer")
  except Exception:  # pylint: disable=broad-except
    return None
  return getattr(module, "TPUEmbedding", None)


def _check_strategy() -> None:
  if delegate.on_tpu():
    raise RuntimeError(
        "tfemb.patch() routes TensorFlow's TPU embedding classes to tfemb "
        "off the TPU; under a TPUStrategy TensorFlow's own classes already "
        "run. Call it outside any TPUStrategy scope, or not at all on a "
        "TPU.")


def _install() -> None:
  """Routes every module attribute holding one of the classes, recording
  each in `_CHANGED`."""
  replacements = _replacements()
  for module in list(sys.modules.values()):
    namespace = getattr(module, "__dict__", None)
    if not isinstance(namespace, dict) or module.__name__.startswith(
        "tfemb"):
      continue
    for name, value in list(namespace.items()):
      pair = replacements.get(id(value))
      if pair is not None and value is pair[0]:
        setattr(module, name, pair[1])
        _CHANGED.append((module, name, value))


class Patch:
  """A `tfemb.patch()`; `undo()` or leaving its `with` block ends it.
  Patches nest: the classes stay routed until every patch is undone (the
  last undo, normally the outermost's, puts TensorFlow's classes back).
  Undoing twice is harmless."""

  @property
  def active(self) -> bool:
    return self in _ACTIVE

  def undo(self) -> None:
    """Ends this patch; the last one to end puts back every attribute the
    patches changed. Harmless if done."""
    with _LOCK:
      if self not in _ACTIVE:
        return
      _ACTIVE.remove(self)
      if _ACTIVE:
        return
      for module, name, original in reversed(_CHANGED):
        setattr(module, name, original)
      _CHANGED.clear()

  def __enter__(self) -> "Patch":
    return self

  def __exit__(self, *exc) -> None:
    self.undo()

  def __repr__(self) -> str:
    return (f"<tfemb patch: {len(_CHANGED)} names routed, "
            f"{'active' if self.active else 'undone'}>")


def patch() -> Patch:
  """Routes `tf.tpu.experimental.embedding`'s engine classes and
  tensorflow-recommenders' `TPUEmbedding` layer to tfemb's, in every module
  loaded now (and so in every module loaded later that imports them from
  there). Returns a new `Patch`: call `undo()`, or use it as a context
  manager. Patches nest: one made while patched changes nothing more, and
  undoing it leaves the classes routed until the outer patch is undone."""
  _check_strategy()
  with _LOCK:
    if not _ACTIVE:
      _install()
    installed = Patch()
    _ACTIVE.append(installed)
    return installed


def unpatch() -> None:
  """Undoes every `tfemb.patch()` (harmless when not patched)."""
  for active in list(_ACTIVE):
    active.undo()
