"""How tfemb recognises Keras' `model.export`: a hook on `ExportArchive`.

Keras calls no method of a layer when it exports a model, and it traces
the serving function before `tf.saved_model.save` runs (so outside
TensorFlow's save context). What it does call are the methods of its
`ExportArchive`: `model.export(path)` is `archive.track(model)`,
`archive.add_endpoint("serve", model.__call__, input_signature)` and
`archive.write_out(path)`, and every trace of an endpoint happens inside
one of the last two (Keras 3.15 and tf_keras trace in `write_out`).

`install()` wraps those two methods of the archive class of the Keras in
use (`tf.keras`: Keras 3, or tf_keras with `TF_USE_LEGACY_KERAS=1`): while
either runs, the archive's inference export (`tfemb.serving.export.Export`,
one per archive, so every trace of it reads the same tables) is the
current export, and the layer's lookups traced then read the inference
tables. `tfemb.layers` installs the hook when it is imported; installing
twice changes nothing; a Keras without these methods gets a warning. The
wrappers pass every argument through and return what Keras returns.

This covers `model.export`, tf_keras' `model.export`, and an
`ExportArchive` filled by hand (`track`, `add_endpoint(name, fn,
input_signature=...)`, `write_out`). It does not cover a `tf.function`
traced before it is handed to `add_endpoint` without an
`input_signature` (it was traced as a plain call and reads the training
storage); nor an endpoint called before `write_out` (its trace is a plain
call's). `tests/serving/test_keras_export.py` checks the hook point of the
installed Keras and serves an export without tfemb.
"""

import functools
import warnings
import weakref

import tensorflow as tf

from tfemb.serving import export

# The methods of `ExportArchive` that trace endpoints (Keras 3, tf_keras).
HOOKED_METHODS = ("add_endpoint", "write_out")
_HOOKED = "_tfemb_export_hook"  # marks a wrapper (installed once)
_exports = weakref.WeakKeyDictionary()  # archive -> its `Export`


def archive_class() -> type:
  """The class of the archives `tf.keras.export.ExportArchive()` makes
  (Keras 3 returns a backend's class that does not derive from
  `keras.export.ExportArchive`)."""
  return type(tf.keras.export.ExportArchive())


def export_of(archive) -> export.Export:
  """The inference export that `archive` writes (float32 tables)."""
  if archive not in _exports:
    _exports[archive] = export.Export(tf.float32)
  return _exports[archive]


def _hooked(method):

  @functools.wraps(method)
  def wrapper(self, *args, **kwargs):
    with export.exporting(export_of(self)):
      return method(self, *args, **kwargs)

  setattr(wrapper, _HOOKED, True)
  return wrapper


def installed(cls: type) -> bool:
  """Whether `cls`'s hooked methods are tfemb's wrappers."""
  return all(getattr(getattr(cls, name, None), _HOOKED, False)
             for name in HOOKED_METHODS)


def install() -> bool:
  """Wraps `add_endpoint` and `write_out` of the archive class of
  `tf.keras` (once). Where this Keras lacks them, warns (training and
  `export_for_serving` still work) and returns False."""
  try:
    cls = archive_class()
  except AttributeError:  # no `tf.keras.export`
    cls = None
  if cls is None or not all(callable(getattr(cls, name, None))
                            for name in HOOKED_METHODS):
    warnings.warn(
        "tfemb cannot recognise model.export with this Keras (its "
        "ExportArchive has no add_endpoint and write_out): export models "
        "with tfemb.layers.TPUEmbedding by tfemb.export_for_serving.")
    return False
  for name in HOOKED_METHODS:
    method = getattr(cls, name)
    if not getattr(method, _HOOKED, False):
      setattr(cls, name, _hooked(method))
  return True
