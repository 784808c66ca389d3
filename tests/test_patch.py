"""`tfemb.patch()` and `python -m tfemb.run`: TPU code that builds
TensorFlow's (and tensorflow-recommenders') classes gets tfemb's off the
TPU, whatever name it reached them by, while every name in TensorFlow's
modules stays TensorFlow's; on a TPU TensorFlow's own engines construct as
without the patch; `undo()` removes the hooks (docs/tpu.md, "Running a TPU
codebase unchanged")."""

import inspect
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v1
from tensorflow.python.tpu import tpu_embedding_v2
from tensorflow.python.tpu import tpu_embedding_v3

import reference
import tfemb
import tfemb.layers
from tfemb import patching
from tfemb import run as tfemb_run
from tpu_stand_in import EmbeddingFeature, StandInTPUStrategy, use_strategy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() in ("1", "true")
API = tf.tpu.experimental.embedding
ORIGINAL = {"TPUEmbedding": tpu_embedding_v2.TPUEmbedding,
            "TPUEmbeddingV2": tpu_embedding_v3.TPUEmbeddingV2,
            "TPUEmbeddingV0": tpu_embedding_v1.TPUEmbeddingV0}
OURS = {"TPUEmbedding": tfemb.TPUEmbedding,
        "TPUEmbeddingV2": tfemb.TPUEmbeddingV2,
        "TPUEmbeddingV0": tfemb.TPUEmbeddingV0}
# Every way a program reaches a class, taken before any patch: the public
# name, TensorFlow's module, a list and a closure.
KEPT = {name: [cls] for name, cls in ORIGINAL.items()}
CLOSURES = {name: (lambda cls=cls: cls) for name, cls in ORIGINAL.items()}


def _names():
  """Every module attribute that holds one of TensorFlow's engines."""
  return {(module.__name__, attribute): value
          for module in list(sys.modules.values())
          if isinstance(getattr(module, "__dict__", None), dict)
          for attribute, value in list(vars(module).items())
          if any(value is cls for cls in ORIGINAL.values())}


def _config():
  table = API.TableConfig(10, 4, name="t")
  return {"f": API.FeatureConfig(table, output_shape=[2])}


def _built(cls):
  return cls(_config(), API.SGD(0.1))


@pytest.mark.parametrize("name", [
    "TPUEmbedding", "TPUEmbeddingV0",
    # The host TPUEmbeddingV2 needs TensorFlow's SparseCore stacker.
    pytest.param("TPUEmbeddingV2",
                 marks=pytest.mark.requires_tensorflow("2.17"))])
def test_every_path_to_an_engine_class_builds_tfembs_off_the_tpu(name):
  names = _names()
  with tfemb.patch() as patch:
    assert _names() == names  # no name in any module changed
    for reached in (getattr(API, name), ORIGINAL[name], KEPT[name][0],
                    CLOSURES[name]()):
      assert reached is ORIGINAL[name]
      assert type(_built(reached)) is OURS[name]
  assert _names() == names
  patch.undo()  # twice: harmless
  tfemb.unpatch()
  if name == "TPUEmbedding":  # TensorFlow's own class again (V2 and V0
    assert type(_built(ORIGINAL[name])) is ORIGINAL[name]  # need a TPU)


@pytest.mark.parametrize("feature,name", [
    (EmbeddingFeature.V1, "TPUEmbedding"),
    (EmbeddingFeature.V2, "TPUEmbeddingV2"),
    (EmbeddingFeature.UNSUPPORTED, "TPUEmbeddingV0")])
def test_on_a_tpu_tensorflows_engines_construct_as_without_the_patch(
    monkeypatch, feature, name):
  """Patched first, then a TPU's strategy (the stand-in): TensorFlow's own
  classes build themselves as they do unpatched, `super(TPUEmbeddingV0,
  self)` and TensorFlow's `isinstance` checks included."""
  stand_in = StandInTPUStrategy(feature, num_replicas=8)
  with monkeypatch.context() as tpu:
    use_strategy(tpu, stand_in)
    unpatched = _built(ORIGINAL[name])
  with tfemb.patch():
    use_strategy(monkeypatch, stand_in)
    patched = [_built(cls) for cls in (getattr(API, name), KEPT[name][0],
                                       CLOSURES[name]())]
    # tfemb's class hands the work to TensorFlow's own, not back to itself.
    delegated = _built(OURS[name])
  for engine in patched + [delegated]:
    assert type(engine) is ORIGINAL[name]
    assert isinstance(engine, getattr(API, name))
    assert sorted(vars(engine)) == sorted(vars(unpatched))
    assert list(engine._feature_config) == list(unpatched._feature_config)  # pylint: disable=protected-access


def test_patches_nest_as_a_stack():
  """An inner patch's end leaves the outer one in force; the outermost's
  end removes the hooks."""
  routed = lambda: type(_built(API.TPUEmbedding)) is tfemb.TPUEmbedding  # pylint: disable=unnecessary-lambda-assignment
  with tfemb.patch() as outer:
    with tfemb.patch() as inner:
      assert inner is not outer and inner.active and outer.active
      assert routed()
    assert not inner.active and outer.active
    assert routed()
    assert "active" in repr(outer) and "undone" in repr(inner)
    inner.undo()  # again: harmless, the outer patch stays
    assert routed()
  assert not routed()
  # Undone out of order: routed until the last one ends.
  first, second = tfemb.patch(), tfemb.patch()
  first.undo()
  assert routed()
  second.undo()
  assert not routed()
  # unpatch() ends every patch.
  tfemb.patch(), tfemb.patch()
  tfemb.unpatch()
  assert not routed() and not patching._ACTIVE  # pylint: disable=protected-access
  assert "__new__" not in vars(tpu_embedding_v2.TPUEmbedding) or (
      vars(tpu_embedding_v2.TPUEmbedding)["__new__"].__func__
      .builds_as_object_new)


@pytest.mark.parametrize("name", sorted(ORIGINAL))
def test_a_patch_leaves_tensorflows_signatures_as_they_were(name):
  """What `inspect` (so `help()`, IDEs and tests/test_namespace.py) shows
  for TensorFlow's class, while patched and after."""
  before = inspect.signature(ORIGINAL[name])
  assert "feature_config" in before.parameters
  with tfemb.patch():
    assert inspect.signature(ORIGINAL[name]) == before
  assert inspect.signature(ORIGINAL[name]) == before


def test_tpu_code_trains_with_the_tpus_numbers_under_the_patch():
  """Code written against tf.tpu.experimental.embedding: SGD on the summed
  gradient of the touched row."""
  init = np.arange(12, dtype=np.float32).reshape(3, 4)
  with tfemb.patch():
    table = API.TableConfig(3, 4, name="t",
                            initializer=tf.constant_initializer(init))
    embedding = API.TPUEmbedding({"f": API.FeatureConfig(table)},
                                 API.SGD(0.5))
    embedding.enqueue({"f": tf.constant([1, 1, 2])}, training=True)
    embedding.dequeue()
    embedding.apply_gradients({"f": tf.ones([3, 4])})
  want = reference.Table(init, "sgd", {})
  want.apply(reference.row_gradients(zip([1, 1, 2], np.ones((3, 4)))), 0.5)
  np.testing.assert_array_equal(embedding.embedding_tables[table].numpy(),
                                want.w)


def test_the_patch_refuses_a_tpu_strategy(monkeypatch):
  use_strategy(monkeypatch, StandInTPUStrategy())
  with pytest.raises(RuntimeError, match="under a TPUStrategy"):
    tfemb.patch()
  assert not patching._ACTIVE  # pylint: disable=protected-access


def test_tensorflow_recommenders_layer_by_every_path():
  """tfrs (which needs tf_keras): its layer, by its public name and by the
  name its PartialTPUEmbedding imported, builds tfemb's layer; the names
  stay tfrs'."""
  if not LEGACY:  # tfrs refuses to import under Keras 3
    assert patching._tfrs_layer() is None  # pylint: disable=protected-access
    return
  import tensorflow_recommenders as tfrs  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from tensorflow_recommenders.experimental.layers.embedding import (
      partial_tpu_embedding)
  # pylint: enable=g-import-not-at-top
  original = tfrs.layers.embedding.TPUEmbedding
  config = {"f": API.FeatureConfig(API.TableConfig(10, 4, name="t"))}
  with tfemb.patch():
    for cls in (tfrs.layers.embedding.TPUEmbedding,
                partial_tpu_embedding.TPUEmbedding):
      assert cls is original
      assert type(cls(config, API.SGD(0.1))) is tfemb.layers.TPUEmbedding
  assert tfrs.layers.embedding.TPUEmbedding is original
  assert type(original(config, API.SGD(0.1))) is original


def run(*args, cwd=None):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
             PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  return subprocess.run([sys.executable, "-m", "tfemb.run", *args],
                        capture_output=True, text=True, env=env, cwd=cwd,
                        timeout=300, check=False)


SCRIPT = '''
import sys
import tensorflow as tf
import tfemb
from tensorflow.python.tpu.tpu_embedding_v2 import TPUEmbedding
with tfemb.patch():  # the script's own patch: the run's stays in force
  pass
api = tf.tpu.experimental.embedding
table = api.TableConfig(10, 4, name="t")
engine = api.TPUEmbedding({"f": api.FeatureConfig(table)}, api.SGD(0.1))
internal = TPUEmbedding({"f": api.FeatureConfig(table)}, api.SGD(0.1))
print(type(engine).__module__, type(internal).__module__, sys.argv)
'''


@pytest.mark.parametrize("argv", [["missing.py"], ["-m", "missing_mod_47"],
                                  ["-m", "json.missing_47"], ["empty_dir"],
                                  ["-m", "missing_47.py"]])
def test_tfemb_run_refuses_what_python_refuses_as_python_does(
    tmp_path, capsys, monkeypatch, argv):
  """The same stderr and exit status as `python ARGS` (no traceback)."""
  (tmp_path / "empty_dir").mkdir()
  monkeypatch.chdir(tmp_path)
  # Both name the interpreter by its absolute path (the pass may have been
  # started as a relative `.venv/bin/python`, which means another file from
  # tmp_path).
  monkeypatch.setattr(sys, "orig_argv", [sys.executable] + sys.orig_argv[1:])
  python = subprocess.run([sys.executable, *argv], capture_output=True,
                          text=True, check=False,
                          env=dict(os.environ, PYTHONPATH=""))
  assert python.returncode in (1, 2) and python.stderr.count("\n") == 1
  assert tfemb_run.main(argv) == python.returncode
  assert capsys.readouterr() == ("", python.stderr)


def test_tfemb_run_gives_a_script_its_absolute_file(tmp_path, capsys,
                                                    monkeypatch):
  (tmp_path / "show.py").write_text(
      "import sys\nprint(__name__, __file__, sys.argv)\n")
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, "argv", list(sys.argv))
  monkeypatch.setattr(sys, "path", list(sys.path))
  assert tfemb_run.main(["show.py", "x"]) == 0
  assert capsys.readouterr().out == (
      f"__main__ {tmp_path / 'show.py'} ['show.py', 'x']\n")
  assert sys.path[0] == str(tmp_path) and not patching._ACTIVE


def test_an_uncaught_error_is_printed_as_python_prints_it(tmp_path):
  """The traceback, status and directory on `sys.path` of `python
  script.py`: no frame of tfemb.run's, and the working directory is not
  on the path (a module beside the caller does not shadow one beside the
  script)."""
  (tmp_path / "code").mkdir()
  (tmp_path / "code" / "helper.py").write_text("WHERE = 'script dir'\n")
  (tmp_path / "helper.py").write_text("WHERE = 'working dir'\n")
  (tmp_path / "code" / "fails.py").write_text(
      "import helper\n"
      "print(helper.WHERE)\n"
      "def step():\n"
      "  raise ValueError('feature `f`: bad ids')\n"
      "step()\n")
  python = subprocess.run([sys.executable, "code/fails.py"], cwd=tmp_path,
                          capture_output=True, text=True, check=False,
                          env=dict(os.environ, PYTHONPATH=""))
  assert python.returncode == 1 and python.stdout == "script dir\n"
  done = run("code/fails.py", cwd=tmp_path)
  assert (done.returncode, done.stdout) == (1, "script dir\n"), done.stderr
  traceback = done.stderr[done.stderr.index("Traceback"):]
  assert traceback == python.stderr
  assert "tfemb" not in traceback


# The script is a mid-level TPU program, no Keras: the same work in both
# passes, so it runs once (`runs_under`), in the pass with room.
@pytest.mark.runs_under("tf_keras")
def test_python_m_tfemb_run_runs_a_script_and_a_module(tmp_path):
  script = tmp_path / "train_on_tpu.py"
  script.write_text(SCRIPT + "print(__file__)\n")
  done = run("train_on_tpu.py", "--steps", "3", cwd=tmp_path)
  assert done.returncode == 0, done.stderr[-2000:]
  lines = done.stdout.splitlines()
  assert lines[0].split()[:2] == ["tfemb.mid_level", "tfemb.mid_level"]
  assert lines[0].endswith("['train_on_tpu.py', '--steps', '3']")
  assert lines[1] == str(script)  # absolute, as Python gives it
  # A missing script: Python's line and status, no traceback.
  done = run("missing.py", cwd=tmp_path)
  assert (done.returncode, done.stdout) == (2, "")
  assert done.stderr.splitlines()[-1].endswith(
      f": can't open file '{tmp_path}/missing.py': [Errno 2] No such file "
      "or directory") and "Traceback" not in done.stderr
  done = run("-m", "train_on_tpu", "x", cwd=tmp_path)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.startswith("tfemb.mid_level")
  assert run().returncode == 2
