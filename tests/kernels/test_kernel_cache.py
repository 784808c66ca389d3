"""A damaged or foreign library in the kernel cache never crashes a process
(tfemb/kernels/build.py, library_record.py).

Each cached library has a record beside it (`<library>.json`: its size and
digest, the TensorFlow it was compiled against). A library that does not
match its record, or a record of another TensorFlow, is caught before it is
loaded: compiled again where there is a compiler, else passed over with one
warning line, training on TensorFlow's ops. The package's builds are
checked the same way, against their entries in its manifest.

One build, into a module's temporary cache, serves every case: each copies
it and damages the copy. The processes use no Keras: they run under Keras 3
whatever the pass, once (`runs_under`).
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import helpers
import reference
from tfemb import options
from tfemb.kernels import build
from tfemb.kernels import install
from tfemb.kernels import packaged
from tfemb.kernels import rule_table

ROOT = str(helpers.ROOT)

# Trains a 3-row table one SGD step; prints where the kernels came from
# (origin None: TensorFlow's ops) and the table.
_TRAIN = """
import json
import tensorflow as tf
import tfemb
from tfemb.kernels import build

embedding = tfemb.TPUEmbedding(
    {"f": tfemb.FeatureConfig(tfemb.TableConfig(
        3, 2, name="t", initializer=tf.zeros_initializer()))},
    tfemb.SGD(0.25))
embedding.build(3)
embedding.enqueue({"f": tf.constant([2, 2, 0])}, training=True)
embedding.apply_gradients({"f": tf.ones_like(embedding.dequeue()["f"])})
print(json.dumps({"origin": build.loaded().origin,
                  "path": build.loaded().path,
                  "table": embedding.embedding_tables["t"].numpy().tolist()}))
"""


def _trained():
  """The table after `_TRAIN`'s step (tests/reference.py)."""
  table = reference.Table(np.zeros((3, 2)), "sgd", {})
  table.apply(reference.row_gradients(
      reference.contributions([[2], [2], [0]], "sum", np.ones((3, 2)))), 0.25)
  return table.w


_UNAVAILABLE = "fused CPU kernels unavailable"


def _env(cache, **changes):
  # kernel_march names a target: the cache's build, never a packaged one;
  # the compiler's default, whose cache key does not ask the compiler, so
  # a process without one looks for the same library.
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="0",
             TFEMB_KERNEL_MARCH="", TFEMB_KERNEL_CACHE=str(cache))
  env.pop("TFEMB_FUSED_KERNELS", None)
  env.update(changes)
  return env


def _start(cache, **env):
  return subprocess.Popen([sys.executable, "-c", _TRAIN], cwd=ROOT,
                          env=_env(cache, **env), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _finish(process):
  """The process's report and its standard error, once it trained."""
  stdout, stderr = process.communicate(timeout=600)
  assert process.returncode == 0, stderr[-3000:]  # no crash, no traceback
  assert "Traceback" not in stderr, stderr[-3000:]
  out = json.loads(stdout.strip().splitlines()[-1])
  np.testing.assert_array_equal(out["table"], _trained())
  return out, stderr


def _library(cache):
  [name] = [n for n in os.listdir(cache) if n.endswith(".so")]
  return os.path.join(cache, name)


def _assert_library_and_record_only(cache):
  """The cache holds the library, its record, its lock and the generated
  header; the record names the library's size and digest."""
  library = _library(cache)
  names = set(os.listdir(cache))
  [include] = [n for n in names if n.startswith("include-")]
  assert names == {include} | {os.path.basename(library) + suffix
                               for suffix in ("", ".json", ".lock")}, names
  assert os.listdir(os.path.join(cache, include)) == [rule_table.FILE_NAME]
  with open(library + ".json") as f:
    record = json.load(f)
  with open(library, "rb") as f:
    contents = f.read()
  assert record["size"] == len(contents)
  assert record["sha256"] == hashlib.sha256(contents).hexdigest()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """A kernel cache with a fresh build in it (compiled once)."""
  cache = tmp_path_factory.mktemp("built") / "cache"
  done = subprocess.run([sys.executable, "-m", "tfemb.kernels"], cwd=ROOT,
                        env=_env(cache), capture_output=True, text=True,
                        timeout=900, check=False)
  assert done.returncode == 0, done.stdout + done.stderr[-3000:]
  assert "from the kernel cache, for the compiler's default" in done.stdout
  return cache


def _copy(built, tmp_path):
  cache = tmp_path / "cache"
  shutil.copytree(built, cache)
  return cache


def _truncate(library):
  size = os.path.getsize(library)
  with open(library, "r+b") as f:
    f.truncate(size // 2)  # a copy cut short, a full disk


def _foreign(library):
  # Another valid shared library: one of TensorFlow's own (a loader
  # that trusted the name would load it and fail on its first op).
  from tensorflow.python.util import _pywrap_determinism  # pylint: disable=g-import-not-at-top
  shutil.copyfile(_pywrap_determinism.__file__, library)


def _edit_record(library, **changes):
  with open(library + ".json") as f:
    record = json.load(f)
  record.update(changes)
  with open(library + ".json", "w") as f:
    json.dump(record, f)


_DAMAGES = {
    "truncated": _truncate,
    "foreign": _foreign,
    "other_tensorflow": lambda library: _edit_record(
        library, tensorflow="2.0.0"),
    "other_tensorflow_build": lambda library: _edit_record(
        library, tensorflow_build="0" * 16),
}


# In the long suite (the suite's time): CI's damaged-library case below
# builds into the cache and loads what it wrote.
@pytest.mark.long
@pytest.mark.runs_under("keras3")
def test_a_build_writes_its_library_and_record_only_and_is_loaded_as_is(
    built, tmp_path):
  _assert_library_and_record_only(built)  # no temporary file left
  cache = _copy(built, tmp_path)
  # Intact: loaded from the cache with no compiler at hand.
  out, stderr = _finish(_start(cache, CXX="/nonexistent/c++"))
  assert out["origin"] == "cache" and out["path"] == _library(cache)
  assert _UNAVAILABLE not in stderr


@pytest.mark.parametrize("damage", sorted(_DAMAGES))
@pytest.mark.runs_under("keras3")
def test_a_damaged_or_foreign_library_without_a_compiler_is_refused_with_one_warning(
    damage, built, tmp_path):
  cache = _copy(built, tmp_path)
  _DAMAGES[damage](_library(cache))
  out, stderr = _finish(_start(cache, CXX="/nonexistent/c++"))
  assert out["origin"] is None  # TensorFlow's ops
  lines = [l for l in stderr.splitlines() if "tfemb" in l]
  assert len(lines) == 1, stderr
  assert _UNAVAILABLE in lines[0] and _library(cache) in lines[0], lines[0]
  assert "no C++ compiler" in lines[0]


@pytest.mark.runs_under("keras3")
def test_a_damaged_library_is_compiled_again_by_one_of_two_processes(
    built, tmp_path):
  # Two processes meet the cut library at once: one compiles it again, the
  # other waits for it, and both train on the fused kernels.
  cache = _copy(built, tmp_path)
  _truncate(_library(cache))
  processes = [_start(cache), _start(cache)]
  results = [_finish(p) for p in processes]
  for out, stderr in results:
    assert out["origin"] == "cache" and out["path"] == _library(cache)
    assert _UNAVAILABLE not in stderr
  _assert_library_and_record_only(cache)


def test_a_damaged_packaged_build_is_passed_over_before_it_is_loaded(
    built, tmp_path, monkeypatch):
  # The package's builds, made at install (from the built cache: no
  # compile), each with its record in the manifest.
  directory = str(tmp_path / "lib")
  made = install.write(directory, cache=str(_copy(built, tmp_path)),
                       march_list=[""])
  [entry] = made["builds"]
  library = os.path.join(directory, entry["file"])
  with open(library, "rb") as f:
    assert entry["sha256"] == hashlib.sha256(f.read()).hexdigest()
  find = packaged.find
  monkeypatch.setattr(packaged, "find",
                      lambda sources: find(sources, directory))
  loads = []  # what would be loaded, never loaded in this process
  monkeypatch.setattr(build.tf, "load_op_library", loads.append)
  monkeypatch.setenv("CXX", "/nonexistent/c++")
  opts = options.Options(kernel_march="auto",
                         kernel_cache=str(tmp_path / "empty"))
  assert build._try_load(opts).origin == "package"  # intact
  assert loads == [library]
  _truncate(library)
  result = build._try_load(opts)
  assert loads == [library]  # not loaded again
  assert result.error is not None
  warning = result.error.warning()
  assert "no C++ compiler" in warning and library in warning, warning
  assert "\n" not in warning
