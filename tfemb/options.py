"""How the host engine runs: options set in code, per engine or per process.

    import tfemb

    with tfemb.options.use(fused_kernels=False):
      embedding = tfemb.TPUEmbedding(...)   # this engine: TensorFlow's ops
    tfemb.options.set(malloc_tuning=False)  # every engine built from now on

An engine reads `get()` once, when it is constructed, and keeps those
options for its life; changing them later changes only engines built later.
`use(**changes)` applies changes for the duration of a `with` block (blocks
nest, the inner one winning; other threads see them too while the block
runs); `set(**changes)` applies them for the rest of the process. Unknown
names raise a TypeError naming the valid ones, and so does a value of the
wrong type (`fused_kernels="off"`: the switches take True or False).

Each option defaults to an environment variable, read by `get()` (see
`Options`); the environment only gives defaults, code overrides them.

Two options reach beyond one engine:

* `malloc_tuning` is process-wide: the first engine built with it on sets
  glibc malloc's thresholds for the whole process (`tfemb.heap`), for good.
  Decline it with `tfemb.options.set(malloc_tuning=False)` (or
  `TFEMB_MALLOC_TUNING=0`) before the first engine is built.
* A process loads one build of the kernels (their ops have fixed names),
  the first one asked for: `kernel_march` and `kernel_cache` count until
  then.
"""

import contextlib
import dataclasses
import os
import threading
from typing import Any, ContextManager, Dict, Iterator, List, Optional

_OFF = ("0", "false", "no", "off")


def _flag(name: str, default: str = "1") -> bool:
  return os.environ.get(name, default).strip().lower() not in _OFF


@dataclasses.dataclass(frozen=True)
class Options:
  """The host engine's options.

  Each defaults to its environment variable, then to the value in brackets.

  Attributes:
    fused_kernels: `TFEMB_FUSED_KERNELS` [on]. The fused CPU kernels
      (`tfemb.kernels`) where a table can take them; off: TensorFlow's ops
      everywhere (the same numbers, slower).
    interleaved_slots: `TFEMB_INTERLEAVED_SLOTS` [on]. A table's slots
      beside its parameters in one variable where it can take them
      (`tfemb.interleaved_tables`; needs `fused_kernels`); off: one
      variable each.
    malloc_tuning: `TFEMB_MALLOC_TUNING` [on]. When an engine builds its
      tables, raise glibc malloc's mmap and trim thresholds (`tfemb.heap`).
      This is process-wide: it changes how the whole process allocates,
      for every library in it, and is not undone. Decline it with
      `malloc_tuning=False`, set before the first engine is built.
    kernel_march: `TFEMB_KERNEL_MARCH` [auto]. Which build of the kernels:
      "auto", the package's build for this CPU where it matches the
      installed TensorFlow, else compiled here for "native"; any other
      value is the `-march` to compile them for ("": the compiler's
      default target) (`tfemb.kernels.build`).
    kernel_cache: `TFEMB_KERNEL_CACHE` [None: `$XDG_CACHE_HOME/tfemb` or
      `~/.cache/tfemb`]. Where compiled kernels are kept.
    cluster_update_lock: `TFEMB_CLUSTER_UPDATE_LOCK` [off]. Under
      `ParameterServerStrategy`, every step's update under one lock on the
      first parameter server, all or nothing across the servers, one step
      at a time in the whole cluster; off: each shard's rows updated under
      a lock of its own on the shard's server, so that steps on different
      shards and servers run side by side (docs/strategies.md,
      "Parameter servers").

  In the environment a switch is off for "0", "false", "no" or "off". In
  code every option has its type: the switches take True or False only
  (not those spellings: `fused_kernels="off"` is refused, not read as on),
  `kernel_march` a str, `kernel_cache` None, a str or an `os.PathLike`
  (kept as a str); anything else raises a TypeError naming the option and
  what it takes.
  """

  fused_kernels: bool = dataclasses.field(
      default_factory=lambda: _flag("TFEMB_FUSED_KERNELS"))
  interleaved_slots: bool = dataclasses.field(
      default_factory=lambda: _flag("TFEMB_INTERLEAVED_SLOTS"))
  malloc_tuning: bool = dataclasses.field(
      default_factory=lambda: _flag("TFEMB_MALLOC_TUNING"))
  kernel_march: str = dataclasses.field(
      default_factory=lambda: os.environ.get("TFEMB_KERNEL_MARCH", "auto"))
  kernel_cache: Optional[str] = dataclasses.field(
      default_factory=lambda: os.environ.get("TFEMB_KERNEL_CACHE") or None)
  cluster_update_lock: bool = dataclasses.field(
      default_factory=lambda: _flag("TFEMB_CLUSTER_UPDATE_LOCK", "0"))

  def __post_init__(self):
    for field in dataclasses.fields(self):
      object.__setattr__(self, field.name,
                         _checked_value(field.name,
                                        getattr(self, field.name)))


_NAMES = tuple(f.name for f in dataclasses.fields(Options))
_SWITCHES = ("fused_kernels", "interleaved_slots", "malloc_tuning",
             "cluster_update_lock")


def _checked_value(name: str, value: Any) -> Any:
  """`value`, if option `name` takes it (a path as a str); else a
  TypeError naming the option and what it takes."""
  if name in _SWITCHES:
    if isinstance(value, bool):
      return value
    expected = ("True or False (the environment's \"0\"/\"off\" and "
                "\"1\"/\"on\" spellings are for TFEMB_* variables)")
  elif name == "kernel_march":
    if isinstance(value, str):
      return value
    expected = 'a str (an -march target; "": the compiler\'s default)'
  else:  # kernel_cache
    if value is None or isinstance(value, (str, os.PathLike)):
      return None if value is None else os.fspath(value)
    expected = "None or a directory (a str or os.PathLike)"
  raise TypeError(f"tfemb option {name} takes {expected}; got {value!r}.")

_lock = threading.Lock()
_process: Dict[str, Any] = {}  # from `set`
_scopes: List[Dict[str, Any]] = []  # from `use`, innermost last


def _checked(changes: Dict[str, Any]) -> Dict[str, Any]:
  unknown = sorted(name for name in changes if name not in _NAMES)
  if unknown:
    raise TypeError(f"Unknown tfemb option(s) {unknown}; the options are "
                    f"{list(_NAMES)}.")
  return {name: _checked_value(name, value)
          for name, value in changes.items()}


def get() -> Options:
  """The current options: the environment's defaults, then `set`'s
  changes, then those of every enclosing `use`."""
  with _lock:
    changes = dict(_process)
    for scope in _scopes:
      changes.update(scope)
  return Options(**changes)


def set(**changes) -> None:  # pylint: disable=redefined-builtin
  """Changes options for the rest of the process (engines built later)."""
  changes = _checked(changes)
  with _lock:
    _process.update(changes)


def use(**changes) -> ContextManager[Options]:
  """Changes options inside a `with` block, which gets the options in
  force."""
  return _scope(_checked(dict(changes)))


@contextlib.contextmanager
def _scope(scope: Dict[str, Any]) -> Iterator[Options]:
  with _lock:
    _scopes.append(scope)
  try:
    yield get()
  finally:
    with _lock:
      # This block's own entry, wherever it is: blocks of other threads
      # may have been entered since and be left later.
      del _scopes[next(i for i in range(len(_scopes) - 1, -1, -1)
                       if _scopes[i] is scope)]
