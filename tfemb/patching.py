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

`tfemb.patch(tpu="v5p-8")` (or `TFEMB_TPU=v5p-8` with `tfemb.patch()`, or
`python -m tfemb.run --tpu v5p-8`) also makes the program's TPU itself run
on the CPU as that type: its resolver, `initialize_tpu_system` and
`TPUStrategy(resolver)` give a host `TPUStrategy` (`tfemb.tpu.host_system`),
so the program's TPU branches run, on tfemb's host engines. The CPU is split
into the type's replicas at once, before TensorFlow sets up its devices.
"""

import importlib
import importlib.util
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple


from tfemb.mid_level import TPUEmbedding
from tfemb.sparsecore.engine import TPUEmbeddingV2
from tfemb.tpu import delegate
from tfemb.tpu import host_devices
from tfemb.tpu import host_strategy
from tfemb.tpu import host_system
from tfemb.tpu import tpu_types
from tfemb.tpu.tensorflow_classes import TENSORFLOW_ENGINES
from tfemb.v0 import TPUEmbeddingV0

# tfemb's engine for each of TensorFlow's (`TENSORFLOW_ENGINES`).
_ENGINES = {"TPUEmbedding": TPUEmbedding, "TPUEmbeddingV2": TPUEmbeddingV2,
            "TPUEmbeddingV0": TPUEmbeddingV0}

_LOCK = threading.Lock()
_ACTIVE: List["Patch"] = []  # patches not undone, outermost first
_CHANGED: List[Tuple[Any, str, Any]] = []  # (module, name, original)
# TensorFlow's own modules keep TensorFlow's system functions and strategy
# classes (their code refers to its own names); every other module, the
# public API's included, gets the host's.
_TENSORFLOW_INTERNALS = "tensorflow.python."


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


def _install(replacements: Dict[int, Tuple[Any, Any]],
             changed: List[Tuple[Any, str, Any]],
             skip: Tuple[str, ...]) -> None:
  """Routes every module attribute holding one of `replacements`' objects,
  in modules not named under `skip`, recording each in `changed`."""
  for module in list(sys.modules.values()):
    namespace = getattr(module, "__dict__", None)
    name = getattr(module, "__name__", None)
    if not isinstance(namespace, dict) or not isinstance(name, str) or (
        name.startswith(skip)):
      continue
    for attribute, value in list(namespace.items()):
      pair = replacements.get(id(value))
      if pair is not None and value is pair[0]:
        setattr(module, attribute, pair[1])
        changed.append((module, attribute, value))


def _restore(changed: List[Tuple[Any, str, Any]]) -> None:
  for module, name, original in reversed(changed):
    setattr(module, name, original)
  changed.clear()


def _tpu_routes() -> List[Tuple[Any, Any]]:
  """(TensorFlow's object, the host's) for each public name of the TPU
  system (`tfemb.tpu.host_system`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  config = tf.config
  return [
      (host_system.TFClusterResolver, host_system.HostTPUClusterResolver),
      (tf.tpu.experimental.initialize_tpu_system,
       host_system.initialize_tpu_system),
      (tf.tpu.experimental.shutdown_tpu_system,
       host_system.shutdown_tpu_system),
      (config.experimental_connect_to_cluster,
       host_system.connect_to_cluster(config.experimental_connect_to_cluster)),
      (tf.distribute.TPUStrategy, host_strategy.HostTPUStrategy),
      (tf.distribute.experimental.TPUStrategy, host_strategy.HostTPUStrategy),
      (config.list_logical_devices,
       host_system.guarded_device_lists(config.list_logical_devices)),
      (config.list_physical_devices,
       host_system.guarded_device_lists(config.list_physical_devices)),
      (tf.device, host_system.guarded_device(tf.device)),
  ]


def _start_tpu(tpu_type: tpu_types.TPUType) -> List[Tuple[Any, str, Any]]:
  """Emulates `tpu_type`: the CPU split into its replicas, and the TPU
  system's names routed to the host's (`tfemb.tpu.host_system`)."""
  host_devices.configure(tpu_type)  # refuses before anything is routed
  changed: List[Tuple[Any, str, Any]] = []
  replacements = {id(original): (original, ours)
                  for original, ours in _tpu_routes()}
  _install(replacements, changed, ("tfemb", _TENSORFLOW_INTERNALS))
  host_system.activate(tpu_type)
  return changed


def _requested_type(tpu: Optional[str]) -> Optional[tpu_types.TPUType]:
  if tpu is not None:
    return tpu_types.lookup(tpu)
  return tpu_types.from_environment()


class Patch:
  """A `tfemb.patch()`; `undo()` or leaving its `with` block ends it.
  Patches nest: the classes stay routed until every patch is undone (the
  last undo, normally the outermost's, puts TensorFlow's classes back).
  Undoing twice is harmless."""

  def __init__(self, tpu_type: Optional[tpu_types.TPUType] = None,
               tpu_changes: Optional[List[Tuple[Any, str, Any]]] = None):
    self._tpu_type = tpu_type
    self._tpu_changes = tpu_changes  # set on the patch that started the TPU

  @property
  def active(self) -> bool:
    return self in _ACTIVE

  @property
  def tpu(self) -> Optional[str]:
    """The TPU type emulated under this patch, or None."""
    return self._tpu_type.name if self._tpu_type else None

  def undo(self) -> None:
    """Ends this patch; the last one to end puts back every attribute the
    patches changed. Harmless if done."""
    with _LOCK:
      if self not in _ACTIVE:
        return
      _ACTIVE.remove(self)
      if self._tpu_changes is not None:  # the TPU emulation ends with it
        _restore(self._tpu_changes)
        host_system.deactivate()
      if _ACTIVE:
        return
      _restore(_CHANGED)

  def __enter__(self) -> "Patch":
    return self

  def __exit__(self, *exc) -> None:
    self.undo()

  def __repr__(self) -> str:
    tpu = f", TPU {self.tpu}" if self.tpu else ""
    return (f"<tfemb patch: {len(_CHANGED)} names routed{tpu}, "
            f"{'active' if self.active else 'undone'}>")


def patch(tpu: Optional[str] = None) -> Patch:
  """Routes `tf.tpu.experimental.embedding`'s engine classes and
  tensorflow-recommenders' `TPUEmbedding` layer to tfemb's, in every module
  loaded now (and so in every module loaded later that imports them from
  there). Returns a new `Patch`: call `undo()`, or use it as a context
  manager. Patches nest: one made while patched changes nothing more, and
  undoing it leaves the classes routed until the outer patch is undone.

  Args:
    tpu: a Cloud TPU type (`tfemb.tpu.tpu_types.TYPES`, e.g. "v5p-8"): the
      program's TPU runs on the CPU as that type until this patch is
      undone. None: the type `TFEMB_TPU` names, if set; else no TPU.
      Call it before the program creates any tensor, so the CPU can still
      be split into the type's replicas.
  """
  _check_strategy()
  tpu_type = _requested_type(tpu)
  with _LOCK:
    current = host_system.active_type()
    if tpu_type is not None and current is not None and tpu_type != current:
      raise ValueError(
          f"tfemb.patch(tpu={tpu_type.name!r}) inside a patch emulating a "
          f"{current.name}: one process emulates one TPU type.")
    tpu_changes = None
    if tpu_type is not None and current is None:
      tpu_changes = _start_tpu(tpu_type)
    if not _ACTIVE:
      _install(_replacements(), _CHANGED, ("tfemb",))
    installed = Patch(tpu_type or current, tpu_changes)
    _ACTIVE.append(installed)
    return installed


def unpatch() -> None:
  """Undoes every `tfemb.patch()` (harmless when not patched)."""
  for active in list(_ACTIVE):
    active.undo()
