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

import tfemb
import tfemb.layers
from tfemb import patching

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
  want = init.copy()
  want[1] -= 0.5 * 2
  want[2] -= 0.5
  np.testing.assert_array_equal(embedding.embedding_tables[table].numpy(),
                                want)


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


def test_python_m_tfemb_run_runs_a_script_and_a_module(tmp_path):
  script = tmp_path / "train_on_tpu.py"
  script.write_text(SCRIPT)
  done = run(str(script), "--steps", "3")
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split()[:2] == ["tfemb.mid_level", "tfemb.mid_level"]
  assert done.stdout.strip().endswith(f"['{script}', '--steps', '3']")
  done = run("-m", "train_on_tpu", "x", cwd=tmp_path)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.startswith("tfemb.mid_level")
  assert run().returncode == 2
