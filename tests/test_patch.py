"""`tfemb.patch()` and `python -m tfemb.run`: TPU code that names
TensorFlow's (and tensorflow-recommenders') classes runs on tfemb's, every
alias included, and `undo()` puts each name back (docs/tpu.md, "Running a
TPU codebase unchanged")."""

import os
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v2
from tensorflow.python.tpu import tpu_embedding_v3

import reference
import tfemb
import tfemb.layers
from tfemb import patching
from tfemb import run as tfemb_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEGACY = os.environ.get("TF_USE_LEGACY_KERAS", "0").lower() in ("1", "true")
API = tf.tpu.experimental.embedding
ORIGINAL = (tpu_embedding_v2.TPUEmbedding, tpu_embedding_v3.TPUEmbeddingV2)


@pytest.fixture
def aliased():
  """A module that imported TensorFlow's classes before the patch."""
  module = types.ModuleType("tpu_user_code")
  module.Engine = tpu_embedding_v2.TPUEmbedding
  module.EngineV2 = tpu_embedding_v3.TPUEmbeddingV2
  sys.modules[module.__name__] = module
  yield module
  del sys.modules[module.__name__]


def test_the_engine_classes_and_their_aliases_are_routed_and_restored(aliased):
  with tfemb.patch() as patch:
    assert API.TPUEmbedding is tfemb.TPUEmbedding
    assert API.TPUEmbeddingV2 is tfemb.TPUEmbeddingV2
    assert API.TPUEmbeddingV0 is tfemb.TPUEmbeddingV0
    assert aliased.Engine is tfemb.TPUEmbedding
    assert aliased.EngineV2 is tfemb.TPUEmbeddingV2
  assert (API.TPUEmbedding, API.TPUEmbeddingV2) == ORIGINAL
  assert (aliased.Engine, aliased.EngineV2) == ORIGINAL
  patch.undo()  # twice: harmless
  tfemb.unpatch()
  assert API.TPUEmbedding is ORIGINAL[0]


def test_patches_nest_as_a_stack(aliased):
  """An inner patch's end leaves the outer one in force; the outermost's
  end restores TensorFlow's classes."""
  with tfemb.patch() as outer:
    with tfemb.patch() as inner:
      assert inner is not outer and inner.active and outer.active
      assert API.TPUEmbedding is tfemb.TPUEmbedding
    assert not inner.active and outer.active
    assert API.TPUEmbedding is tfemb.TPUEmbedding
    assert aliased.Engine is tfemb.TPUEmbedding
    assert "active" in repr(outer) and "undone" in repr(inner)
    inner.undo()  # again: harmless, the outer patch stays
    assert API.TPUEmbedding is tfemb.TPUEmbedding
  assert (API.TPUEmbedding, API.TPUEmbeddingV2) == ORIGINAL
  assert (aliased.Engine, aliased.EngineV2) == ORIGINAL
  # Undone out of order: routed until the last one ends.
  first, second = tfemb.patch(), tfemb.patch()
  first.undo()
  assert API.TPUEmbedding is tfemb.TPUEmbedding
  second.undo()
  assert API.TPUEmbedding is ORIGINAL[0]
  # unpatch() ends every patch.
  tfemb.patch(), tfemb.patch()
  tfemb.unpatch()
  assert API.TPUEmbedding is ORIGINAL[0] and not patching._ACTIVE


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
  from tpu_stand_in import StandInTPUStrategy, use_strategy  # pylint: disable=g-import-not-at-top
  use_strategy(monkeypatch, StandInTPUStrategy())
  with pytest.raises(RuntimeError, match="under a TPUStrategy"):
    tfemb.patch()
  assert API.TPUEmbedding is ORIGINAL[0]


def test_under_a_tpu_strategy_a_patched_name_is_tensorflows_class(
    monkeypatch):
  """Patched first, then a TPUStrategy: tfemb hands the work to
  TensorFlow's own class, not back to itself."""
  from tpu_stand_in import StandInTPUStrategy, use_strategy  # pylint: disable=g-import-not-at-top
  received = []
  with tfemb.patch():
    monkeypatch.setitem(patching.TENSORFLOW_ENGINES, "TPUEmbeddingV2",
                        lambda *args: received.append(args) or "tensorflow's")
    use_strategy(monkeypatch, StandInTPUStrategy())
    table = API.TableConfig(10, 4, name="t")
    result = API.TPUEmbeddingV2(
        {"f": API.FeatureConfig(table, output_shape=[2])}, API.SGD(0.1))
  assert result == "tensorflow's" and len(received) == 1


def test_tensorflow_recommenders_layer_and_its_aliases():
  """tfrs (which needs tf_keras): its layer, and the name its
  PartialTPUEmbedding imported, become tfemb's layer."""
  if not LEGACY:  # tfrs refuses to import under Keras 3
    assert patching._tfrs_layer() is None  # pylint: disable=protected-access
    return
  import tensorflow_recommenders as tfrs  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from tensorflow_recommenders.experimental.layers.embedding import (
      partial_tpu_embedding)
  # pylint: enable=g-import-not-at-top
  original = tfrs.layers.embedding.TPUEmbedding
  with tfemb.patch():
    assert tfrs.layers.embedding.TPUEmbedding is tfemb.layers.TPUEmbedding
    assert (tfrs.layers.embedding.tpu_embedding_layer.TPUEmbedding is
            tfemb.layers.TPUEmbedding)
    assert partial_tpu_embedding.TPUEmbedding is tfemb.layers.TPUEmbedding
  assert tfrs.layers.embedding.TPUEmbedding is original


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
print(type(engine).__module__, TPUEmbedding.__module__, sys.argv)
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
