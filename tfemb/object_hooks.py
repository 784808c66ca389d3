"""Hooks on another library's objects that leave its names alone.

`tfemb.patch()` routes TensorFlow's classes and functions by what they are
handed, never by rewriting the names TensorFlow's own code reads (a module
attribute set to another object breaks, for one, TensorFlow's
`super(TPUEmbeddingV0, self)`). Two kinds of hook:

* `ClassHook`: the class's construction (its `__new__`) asks `route` which
  class to build. A subclass of the hooked class is built as it is, and so
  is the hooked class itself when `route` says None.
* `FunctionHook`: the function object's code is a trampoline that asks
  `route` which function to call with the same arguments; the function's
  own code runs when `route` says None. Every reference to the function
  (its module's name, aliases, a copy kept in a list or closure) reaches
  it, since the object is the same.

Removing a hook puts back what was there (`ClassHook.remove` says the one
case CPython does not allow). This module knows nothing of TensorFlow.
"""

import inspect
import threading
import types
from typing import Any, Callable, Dict, Optional, Tuple

_LOCK = threading.Lock()
# The hooked functions by key: (a copy of the function with its own code,
# the route).
_FUNCTIONS: Dict[str, Tuple[Callable[..., Any], Callable[..., Any]]] = {}

Route = Callable[..., Optional[Callable[..., Any]]]


class ClassHook:
  """Routes the construction of `cls` itself (not of its subclasses).

  `route(*args, **kwargs)` returns the class to build instead, or None for
  `cls`. A class that derives from `cls` is built as Python builds it (its
  `__init__` runs once, with the arguments); any other is called with the
  arguments and its result returned. A construction without arguments is
  routed only with `route_bare_calls`: copy and pickle re-create an object
  so, as `cls.__new__(cls)`.
  """

  def __init__(self, cls: type, route: Route, route_bare_calls=False):
    self.cls = cls
    self._route = route
    self._route_bare_calls = route_bare_calls
    self._saved = None  # (whether cls had its own __new__, that __new__)

  @property
  def installed(self) -> bool:
    return self._saved is not None

  def install(self) -> None:
    if self.installed:
      return
    cls, route, bare = self.cls, self._route, self._route_bare_calls
    own = cls.__dict__.get("__new__")

    def inherited_new(klass, args, kwargs):
      if own is not None:
        return own.__get__(None, klass)(klass, *args, **kwargs)
      base_new = super(cls, klass).__new__
      if base_new is object.__new__:  # takes no arguments but the class
        return base_new(klass)
      return base_new(klass, *args, **kwargs)

    def __new__(klass, *args, **kwargs):  # pylint: disable=invalid-name
      target = route(*args, **kwargs) if (
          klass is cls and (args or kwargs or bare)) else None
      if target is None:
        return inherited_new(klass, args, kwargs)
      if isinstance(target, type) and issubclass(target, cls):
        # Python runs target's __init__ with the arguments next.
        return inherited_new(target, args, kwargs)
      return target(*args, **kwargs)

    __new__.__signature__ = _signature(cls)
    self._saved = (own is not None, own)
    cls.__new__ = staticmethod(__new__)

  def remove(self) -> None:
    if not self.installed:
      return
    had_own, own = self._saved
    if had_own:
      self.cls.__new__ = own
    elif super(self.cls, self.cls).__new__ is object.__new__:
      # CPython cannot give a class back `object.__new__` once it had a
      # `__new__` of its own (its type slot stays the Python-level one,
      # and `object.__new__` then refuses the arguments): one that builds
      # as `object.__new__` does stays instead, showing the class's own
      # signature to `inspect` as before.
      self.cls.__new__ = staticmethod(_object_new_of(self.cls))
    else:
      del self.cls.__new__
    self._saved = None


def _object_new_of(cls: type) -> Callable[..., Any]:
  """A `__new__` for `cls` that builds as `object.__new__` does, with the
  signature `inspect` showed for `cls(...)` before it had one."""

  def __new__(klass, *args, **kwargs):  # pylint: disable=invalid-name
    del args, kwargs  # `__init__`'s, as `object.__new__` ignores them
    return object.__new__(klass)

  __new__.__signature__ = _signature(cls)
  __new__.builds_as_object_new = True
  return __new__


def _signature(cls: type) -> Optional[inspect.Signature]:
  """The signature `inspect` shows for `cls(...)`: its `__init__`'s."""
  try:
    return inspect.signature(cls.__init__)
  except (TypeError, ValueError):
    return None


class FunctionHook:
  """Makes the function object `fn` ask `route(*args, **kwargs)` which
  function to call with its arguments (None: its own code).

  `fn` must be a plain Python function without a closure. Its signature,
  defaults, name and docstring stay as they are. While installed,
  `original` is a copy of `fn` with its own code, for a route's function
  to call.
  """

  def __init__(self, fn: types.FunctionType, route: Route):
    if not isinstance(fn, types.FunctionType) or fn.__closure__:
      raise TypeError(f"{fn!r}: only a plain function without a closure "
                      "can be hooked.")
    self.fn = fn
    self._route = route
    self._key = f"{fn.__module__}.{fn.__qualname__}"
    self._saved_code = None
    self.original = None

  @property
  def installed(self) -> bool:
    return self._saved_code is not None

  def install(self) -> None:
    if self.installed:
      return
    fn = self.fn
    original = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__,
                                  fn.__defaults__, fn.__closure__)
    original.__kwdefaults__ = fn.__kwdefaults__
    with _LOCK:
      if self._key in _FUNCTIONS:
        raise RuntimeError(f"{self._key} is hooked already.")
      _FUNCTIONS[self._key] = (original, self._route)
    self._saved_code = fn.__code__
    self.original = original
    fn.__code__ = _trampoline(fn, self._key)

  def remove(self) -> None:
    if not self.installed:
      return
    self.fn.__code__ = self._saved_code
    self._saved_code = self.original = None
    with _LOCK:
      del _FUNCTIONS[self._key]


def dispatch(key: str, args: tuple, kwargs: dict):
  """What a hooked function's trampoline calls: the routed function, or
  the function's own code, with the arguments it was given."""
  with _LOCK:
    entry = _FUNCTIONS.get(key)
  if entry is None:  # the hook was removed while the call began
    raise RuntimeError(f"{key}: its tfemb hook was removed during the call.")
  original, route = entry
  target = route(*args, **kwargs)
  return (original if target is None else target)(*args, **kwargs)


def _trampoline(fn: types.FunctionType, key: str) -> types.CodeType:
  """Code with `fn`'s parameters that calls `dispatch(key, ...)`.

  Written without defaults: the function object keeps its own
  (`__defaults__`, `__kwdefaults__`), which apply to the same parameters.
  """
  positional, keywords, params = [], [], []
  saw_positional_only = saw_star = False
  for p in inspect.signature(fn, follow_wrapped=False).parameters.values():
    if p.kind is p.POSITIONAL_ONLY:
      saw_positional_only = True
    elif saw_positional_only:
      params.append("/")
      saw_positional_only = False
    if p.kind is p.VAR_POSITIONAL:
      params.append(f"*{p.name}")
      positional.append(f"*{p.name}")
      saw_star = True
    elif p.kind is p.KEYWORD_ONLY:
      if not saw_star:
        params.append("*")
        saw_star = True
      params.append(p.name)
      keywords.append(f"{p.name!r}: {p.name}")
    elif p.kind is p.VAR_KEYWORD:
      params.append(f"**{p.name}")
      keywords.append(f"**{p.name}")
    else:
      params.append(p.name)
      positional.append(p.name)
  if saw_positional_only:
    params.append("/")
  source = (
      f"def {fn.__name__}({', '.join(params)}):\n"
      f"  return __import__('tfemb.object_hooks', None, None, ['_'])"
      f".dispatch({key!r}, ({''.join(a + ', ' for a in positional)}), "
      f"{{{', '.join(keywords)}}})\n")
  namespace: Dict[str, Any] = {}
  exec(compile(source, f"<tfemb hook of {key}>", "exec"), {}, namespace)  # pylint: disable=exec-used
  return namespace[fn.__name__].__code__
