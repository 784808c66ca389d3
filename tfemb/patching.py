"""Running a TPU codebase unchanged off the TPU: `tfemb.patch()`.

The patch routes TensorFlow's embedding engines (`TPUEmbedding`,
`TPUEmbeddingV2`, `TPUEmbeddingV0`) and tensorflow-recommenders' Keras
layer (`tfrs.layers.embedding.TPUEmbedding`) to tfemb's by the object:
each class's construction asks where it is (`tfemb.object_hooks`). Off a
TPU it builds tfemb's class of the same name; under a TPU's own
`TPUStrategy` it builds TensorFlow's (or tfrs') own object, exactly as
without the patch (and so it does outside the TPUStrategy of an emulated
TPU, below, as on a TPU's host). No name in TensorFlow's or tfrs' modules changes, so
every way a program reaches a class (the public names,
`tensorflow.python...` paths, aliases, a class kept in a list or a closure
before the patch) is routed, and TensorFlow's own code, which names its
own classes, runs as written. `undo()` removes the hooks; patches nest: the
classes stay routed until every patch is undone.

    import tfemb
    tfemb.patch()                  # or: with tfemb.patch(): ...
    import my_tpu_training_script  # runs on the CPU with the TPU's numbers

`python -m tfemb.run script.py ARGS...` does the same for a script
(`tfemb.run`).

`tfemb.patch(tpu="v5p-8")` (or `TFEMB_TPU=v5p-8` with `tfemb.patch()`, or
`python -m tfemb.run --tpu v5p-8`) also makes the program's TPU itself run
on the CPU as that type: TensorFlow's resolver, `initialize_tpu_system` and
`TPUStrategy` hand a TPU program's set-up to the host
(`tfemb.tpu.host.routes`), so the program's TPU branches run, on tfemb's
host engines. The CPU is split into the type's replicas at once, before
TensorFlow sets up its devices.
"""

import importlib
import importlib.util
import threading
from typing import Any, List, Optional

import tensorflow as tf

from tfemb import object_hooks
from tfemb import tpu_strategies
from tfemb.mid_level import TPUEmbedding
from tfemb.sparsecore.engine import TPUEmbeddingV2
from tfemb.tpu import delegate
from tfemb.tpu.host import devices as host_devices
from tfemb.tpu.host import routes as host_routes
from tfemb.tpu.host import system as host_system
from tfemb.tpu.host import tpu_types
from tfemb.v0 import TPUEmbeddingV0

# tfemb's engine for each of TensorFlow's (`delegate.TENSORFLOW_ENGINES`).
_ENGINES = {"TPUEmbedding": TPUEmbedding, "TPUEmbeddingV2": TPUEmbeddingV2,
            "TPUEmbeddingV0": TPUEmbeddingV0}

_LOCK = threading.Lock()
_ACTIVE: List["Patch"] = []  # patches not undone, outermost first
_ENGINE_HOOKS: List[Any] = []  # installed while any patch is active


def _off_the_tpu(ours: Any):
  """A construction's route: `ours`, unless TensorFlow's own object is what
  a TPU gives: under a TPU's own strategy, and, while a TPU type is
  emulated, outside its TPUStrategy (there TensorFlow's engines take their
  CPU paths or refuse, as they do on a TPU's host)."""

  def route(*args, **kwargs):
    del args, kwargs
    if delegate.on_tpu():
      return None
    if host_system.active_type() is not None and not (
        tpu_strategies.is_tpu_strategy(tf.distribute.get_strategy())):
      return None
    return ours

  return route


def _sparse_core_stats(cls, *args, **kwargs):
  del cls  # TensorFlow's class
  return TPUEmbeddingV2.compute_sparse_core_stats(*args, **kwargs)


def _sparse_core_stats_route(*args, **kwargs):
  """`TPUEmbeddingV2.compute_sparse_core_stats` (TensorFlow's classmethod,
  whose op runs on a TPU's host only): tfemb's, on the CPU, while a TPU
  type is emulated."""
  del args, kwargs
  return _sparse_core_stats if host_system.active_type() else None


def _engine_hooks() -> List[Any]:
  """A hook per object routed: TensorFlow's engine classes and their
  SparseCore statistics, tfrs' layer."""
  # The Keras layer on first use: `import tfemb` does not load Keras.
  import tfemb.layers  # pylint: disable=g-import-not-at-top
  hooks = [object_hooks.ClassHook(cls, _off_the_tpu(_ENGINES[name]))
           for name, cls in delegate.TENSORFLOW_ENGINES.items()]
  stats = vars(delegate.TENSORFLOW_ENGINES["TPUEmbeddingV2"]).get(
      "compute_sparse_core_stats")
  if stats is not None:  # TensorFlow 2.18 on
    hooks.append(object_hooks.FunctionHook(stats.__func__,
                                           _sparse_core_stats_route))
  layer = _tfrs_layer()
  if layer is not None:
    hooks.append(object_hooks.ClassHook(
        layer, _off_the_tpu(tfemb.layers.TPUEmbedding)))
  return hooks


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


def _install(hooks) -> None:
  for hook in hooks:
    hook.install()


def _remove(hooks) -> None:
  for hook in reversed(hooks):
    hook.remove()


def _start_tpu(tpu_type: tpu_types.TPUType) -> List[Any]:
  """Emulates `tpu_type`: the CPU split into its replicas, and TensorFlow's
  TPU system routed to the host's (`tfemb.tpu.host.routes`)."""
  host_devices.configure(tpu_type)  # refuses before anything is routed
  hooks = host_routes.hooks()
  _install(hooks)
  host_system.activate(tpu_type)
  return hooks


def _requested_type(tpu: Optional[str]) -> Optional[tpu_types.TPUType]:
  if tpu is not None:
    return tpu_types.lookup(tpu)
  return tpu_types.from_environment()


class Patch:
  """A `tfemb.patch()`; `undo()` or leaving its `with` block ends it.
  Patches nest: the classes stay routed until every patch is undone (the
  last undo, normally the outermost's, removes the hooks). Undoing twice
  is harmless."""

  def __init__(self, tpu_type: Optional[tpu_types.TPUType] = None,
               tpu_hooks: Optional[List[Any]] = None):
    self._tpu_type = tpu_type
    self._tpu_hooks = tpu_hooks  # set on the patch that started the TPU

  @property
  def active(self) -> bool:
    return self in _ACTIVE

  @property
  def tpu(self) -> Optional[str]:
    """The TPU type emulated under this patch, or None."""
    return self._tpu_type.name if self._tpu_type else None

  def undo(self) -> None:
    """Ends this patch; the last one to end removes every hook. Harmless
    if done."""
    with _LOCK:
      if self not in _ACTIVE:
        return
      _ACTIVE.remove(self)
      if self._tpu_hooks is not None:  # the TPU emulation ends with it
        host_system.deactivate()
        _remove(self._tpu_hooks)
      if _ACTIVE:
        return
      _remove(_ENGINE_HOOKS)
      _ENGINE_HOOKS.clear()

  def __enter__(self) -> "Patch":
    return self

  def __exit__(self, *exc) -> None:
    self.undo()

  def __repr__(self) -> str:
    tpu = f", TPU {self.tpu}" if self.tpu else ""
    return (f"<tfemb patch: {len(_ENGINE_HOOKS)} classes routed{tpu}, "
            f"{'active' if self.active else 'undone'}>")


def patch(tpu: Optional[str] = None) -> Patch:
  """Routes TensorFlow's TPU embedding engine classes and
  tensorflow-recommenders' `TPUEmbedding` layer to tfemb's, by the object:
  built off a TPU, each gives tfemb's class; under a TPU's own strategy,
  its own. Returns a new `Patch`: call `undo()`, or use it as a context
  manager. Patches nest: one made while patched changes nothing more, and
  undoing it leaves the classes routed until the outer patch is undone.

  Args:
    tpu: a Cloud TPU type (`tfemb.tpu.host.tpu_types.TYPES`, e.g. "v5p-8"):
      the program's TPU runs on the CPU as that type until this patch is
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
    tpu_hooks = None
    if tpu_type is not None and current is None:
      tpu_hooks = _start_tpu(tpu_type)
    if not _ACTIVE:
      _ENGINE_HOOKS[:] = _engine_hooks()
      _install(_ENGINE_HOOKS)
    installed = Patch(tpu_type or current, tpu_hooks)
    _ACTIVE.append(installed)
    return installed


def unpatch() -> None:
  """Undoes every `tfemb.patch()` (harmless when not patched)."""
  for active in list(_ACTIVE):
    active.undo()
