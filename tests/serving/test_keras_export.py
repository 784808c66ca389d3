"""How tfemb recognises Keras' `model.export` (`tfemb.serving.
keras_export`): a hook on the `ExportArchive` methods that trace the
serving function. These tests fail when a Keras release moves or changes
that hook point, or when an export it makes stops serving the numpy
reference's numbers without tfemb."""

import inspect
import pathlib

import numpy as np
import tensorflow as tf

from exports import only
from exports import ranking_data as data
from exports import serve_without_tfemb
from exports import trained_ranking_model as trained_model
from exports import variable_bytes
import reference
import tfemb
import tfemb.layers
from tfemb.serving import export
from tfemb.serving import keras_export

keras = tf.keras
# What the hook relies on: the parameters Keras' `model.export` passes.
SIGNATURES = {"add_endpoint": ("self", "name", "fn", "input_signature"),
              "write_out": ("self", "filepath")}


def test_the_hook_point_of_this_keras():
  """The archive class `model.export` uses has the hooked methods, with
  the parameters the hook expects, and tfemb's wrappers are installed."""
  cls = keras_export.archive_class()
  assert keras_export.installed(cls), cls.__mro__
  assert keras_export.install()  # again: nothing changes
  for name, expected in SIGNATURES.items():
    method = getattr(cls, name)
    wrapped = inspect.unwrap(method)
    assert wrapped is not method, name
    params = tuple(inspect.signature(wrapped).parameters)
    assert params[:len(expected)] == expected, (name, params)
  # `model.export` makes the archive through the public class.
  assert isinstance(keras.export.ExportArchive(), cls)


def test_an_archive_traces_its_endpoints_for_its_export(tmp_path):
  """Whichever hooked method traces the endpoint, the trace sees the
  archive's export; outside the archive's methods, none."""
  seen = []

  def endpoint(x):
    seen.append(export.current_export())
    return x

  archive = keras.export.ExportArchive()
  archive.add_endpoint("serve", endpoint,
                       input_signature=[tf.TensorSpec([None], tf.float32)])
  archive.write_out(str(tmp_path / "export"))
  assert seen and all(e is keras_export.export_of(archive) for e in seen)
  assert export.current_export() is None and not export.saving()
  tf.function(endpoint)(tf.constant([1.0]))
  assert seen[-1] is None


def test_model_export_serves_the_reference_numbers_without_tfemb(tmp_path):
  model, layer = trained_model()
  path = str(tmp_path / "export")
  model.export(path)
  tables = {t.name: v.numpy() for t, v in layer.embedding_tables.items()}
  # The inference tables, once (not the training storage with its slots).
  params = sum(v.nbytes for v in tables.values()) + sum(
      w.nbytes for w in model.layers[-1].get_weights())
  assert sum(variable_bytes(path).values()) <= 1.05 * params
  batches = [data(n, 20 + n)[0] for n in (1, 33)]
  served = only(serve_without_tfemb(tmp_path, [(path, x) for x in batches]))
  for x, got in zip(batches, served):
    want = reference.ranking_predictions(tables, x,
                                         model.layers[-1].get_weights())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_lookups_reach_no_export_code_when_nothing_is_saved(monkeypatch):
  """Training and inference go layer -> engine: the serving lookup is
  never called outside a SavedModel's trace."""

  def refuse(*args, **kwargs):
    raise AssertionError("serving code on a training or inference lookup")

  monkeypatch.setattr(export, "serving_activations", refuse)
  model, _ = trained_model()
  x, y = data(16, 3)
  model.predict(x, verbose=0)
  model.evaluate(x, y, verbose=0)
  assert not export.saving()


def test_no_stack_frame_walking():
  package = pathlib.Path(tfemb.__file__).parent
  found = [str(p) for p in package.rglob("*.py")
           if "_getframe" in p.read_text()]
  assert not found

