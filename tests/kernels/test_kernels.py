"""The fused CPU kernels: built once and cached, optional, and safe.

Their numbers are checked against the numpy reference by the training,
lookup and bad-input tests, which run on both host paths (`engine_path`).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import helpers
import reference
import tfemb
from tfemb.kernels import build
from tfemb.kernels import fused_ops

ROOT = str(helpers.ROOT)

# One SGD step on a 6-row table: prints whether the kernels loaded, the op
# types of the traced step and the table after the step.
_SCRIPT = """
import json
import numpy as np
import tensorflow as tf
import tfemb
from tfemb.kernels import build

table = tfemb.TableConfig(
    6, 2, name="t", initializer=tf.constant_initializer(
        np.arange(12, dtype=np.float32).reshape(6, 2) / 10))
embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                               tfemb.SGD(0.5))

@tf.function
def step(ids):
  embedding.enqueue({"f": ids}, training=True)
  activations = embedding.dequeue()
  embedding.apply_gradients({"f": tf.ones_like(activations["f"])})

ids = tf.constant([1, 4, 1, 0], tf.int64)
step(ids)
types = [op.type for op in step.get_concrete_function(ids).graph
         .get_operations()]
print(json.dumps({"loaded": build.load() is not None, "types": types,
                  "table": embedding.embedding_tables[table].numpy()
                  .tolist()}))
"""


# The script's build and mid-level step use no Keras: its tests do the same
# work in both passes, so they run once (`runs_under`), under Keras 3.
def _run(env_changes, tmp_path, cache="cache"):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="0",
             **env_changes)
  env.pop("TFEMB_KERNEL_CACHE", None)
  if cache:
    env["TFEMB_KERNEL_CACHE"] = str(tmp_path / cache)
  done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def _expected_table():
  w = np.arange(12, dtype=np.float32).reshape(6, 2) / 10
  counts = np.bincount([1, 4, 1, 0], minlength=6).astype(np.float32)
  return w - np.float32(0.5) * counts[:, None]


@pytest.mark.parametrize("env", [{"CXX": "/nonexistent/c++"},
                                 {"TFEMB_FUSED_KERNELS": "0"}],
                         ids=["no_compiler", "disabled"])
@pytest.mark.runs_under("keras3")
def test_without_the_kernels_the_engine_uses_tensorflow_ops(env, tmp_path):
  out, stderr = _run(env, tmp_path)
  assert not out["loaded"]
  assert "Unique" in out["types"]
  assert not {"TfembApplyRows", "TfembApplyTables"} & set(out["types"])
  np.testing.assert_allclose(out["table"], _expected_table(), rtol=1e-6)
  if "CXX" in env:  # said once, with the reason
    assert "fused CPU kernels unavailable" in stderr
    assert "no C++ compiler" in stderr


# A build into a fresh cache in the long suite (the suite's time): CI's
# tests/kernels/test_kernel_cache.py builds into fresh and damaged caches.
@pytest.mark.long
@pytest.mark.runs_under("keras3")
def test_a_fresh_cache_builds_the_kernels_and_uses_them(tmp_path):
  out, _ = _run({}, tmp_path)
  assert out["loaded"]
  assert out["types"].count("TfembApplyTables") == 1
  assert "Unique" not in out["types"]
  np.testing.assert_allclose(out["table"], _expected_table(), rtol=1e-6)
  built = os.listdir(tmp_path / "cache")
  assert [f for f in built if f.endswith(".so")], built


@pytest.mark.runs_under("keras3")
def test_an_unwritable_home_falls_back_to_a_temporary_cache(tmp_path):
  # HOME under a regular file: ~/.cache can never be created there.
  blocker = tmp_path / "file"
  blocker.write_text("")
  env = {"HOME": str(blocker / "home"), "XDG_CACHE_HOME": ""}
  out, _ = _run(env, tmp_path, cache=None)
  assert out["loaded"]
  assert out["types"].count("TfembApplyTables") == 1


def test_a_built_library_is_reused_without_compiling(monkeypatch):
  path = build.build()
  assert os.path.exists(path)

  def no_compiler(*args, **kwargs):
    raise AssertionError("compiled again")

  monkeypatch.setattr(build.subprocess, "run", no_compiler)
  assert build.build() == path


def test_ids_out_of_range_raise_even_without_validation(engine_path):
  # With validate_weights_and_indices=False the kernel still checks the
  # range (it must not read outside the table), naming the feature;
  # TensorFlow's gather raises its own error. No table changes either way.
  table = tfemb.TableConfig(5, 2, name="t")
  embedding = tfemb.TPUEmbedding(
      {"f": tfemb.FeatureConfig(table, validate_weights_and_indices=False)},
      tfemb.SGD(0.1))
  embedding.build(2)
  before = embedding.embedding_tables[table].numpy()
  pattern = (r"Feature \W*f\W* \(table \W*t\W*\)" if engine_path == "fused"
             else "5")
  with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
    embedding.enqueue({"f": tf.constant([1, 5], tf.int64)}, training=True)
    activations = embedding.dequeue()
    embedding.apply_gradients({"f": tf.ones_like(activations["f"])})
  np.testing.assert_array_equal(embedding.embedding_tables[table].numpy(),
                                before)


def _transparent_huge_pages():
  try:
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
      return "[never]" not in f.read()
  except OSError:
    return False


needs_transparent_huge_pages = pytest.mark.skipif(
    not _transparent_huge_pages(),
    reason="this machine's kernel has transparent huge pages off (or is not "
    "Linux)")


# Each huge-page test runs in a fresh process: memory that earlier tests
# freed and the allocator hands out again may already sit on 2 MiB pages
# (counted before the table exists) or on 4 KiB ones, so the process-wide
# gain would depend on which tests ran first.
_HUGE_PAGES_SCRIPT = """
import sys
import tensorflow as tf
import tfemb
from benchmarks import procmem
optimizer, rows, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
before = procmem.huge_pages()
table = tfemb.TableConfig(rows, 32, name="big")
embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                               getattr(tfemb, optimizer)(0.1))
embedding.build(4)

@tf.function
def step(ids):
  embedding.enqueue({"f": ids}, training=True)
  activations = embedding.dequeue()
  embedding.apply_gradients({"f": tf.ones_like(activations["f"])})

for _ in range(steps):
  step(tf.constant([3, 70000, 3, rows - 1], tf.int64))
print(procmem.huge_pages() - before)
"""


def _huge_pages_gained(optimizer, rows, steps):
  """Bytes of 2 MiB pages a fresh process gains from building one table of
  `rows` x 32 and taking `steps` steps."""
  path = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=path)
  result = subprocess.run(
      [sys.executable, "-c", _HUGE_PAGES_SCRIPT, optimizer, str(rows),
       str(steps)],
      env=env, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return int(result.stdout.split()[-1])


@needs_transparent_huge_pages
def test_big_tables_are_backed_by_huge_pages():
  # A 16 MiB table, filled whole by its initializer (under the 64 MiB of a
  # block) on 4 KiB pages: after one step, at least its 2 MiB-aligned
  # interior (12 of 16 MiB) is on huge pages.
  assert _huge_pages_gained("SGD", 131072, steps=1) >= 12 * 2**20


@needs_transparent_huge_pages
@pytest.mark.parametrize("optimizer,rows", [
    ("SGD", 600_000),  # a plain variable, filled in blocks
    ("Adagrad", 300_000),  # slots beside the parameters
], ids=["sgd-plain", "adagrad-interleaved"])
def test_tables_filled_in_blocks_are_on_huge_pages_before_any_step(
    optimizer, rows):
  # 76.8 MB of table (and slot): created empty, advised, then filled, so
  # the fill itself takes 2 MiB pages and the first step has nothing to
  # collapse (without the advice: 4 KiB pages until that step).
  assert _huge_pages_gained(optimizer, rows, steps=0) >= 64 * 2**20


@pytest.mark.parametrize("dim", [32, 37])  # compiled width; run-time width
@pytest.mark.parametrize(
    "order", ["first_occurrence", "shuffled", "rows_left_out"])
def test_row_gradients_are_float32_sums_in_the_order_of_the_ids(order, dim):
  """TfembRowGradients (the sums TfembApplyTables makes too) against
  float32 sums from zero in the ids' order, bit for bit: with positions as
  the lookup numbers them (each distinct row first reached in turn), in
  another order, and with rows no id reaches (left at zero). Gradients of
  -0.0 sum to +0.0, as from zero."""
  rng = np.random.default_rng(7)
  rows = 300
  positions = np.concatenate([np.arange(rows),
                              rng.integers(0, rows, size=900)])
  if order != "first_occurrence":
    positions = rng.permutation(positions)
  if order == "rows_left_out":
    positions = positions[(positions % 7 != 3) & (positions != 0)]
  grads = rng.normal(size=(len(positions), dim)).astype(np.float32)
  grads[rng.random(grads.shape) < 0.1] = -0.0
  lib = fused_ops._library()  # pylint: disable=protected-access

  got, finite = lib.tfemb_row_gradients(
      gradients=tf.constant(grads), positions=tf.constant(positions),
      unique_ids=tf.zeros([rows], tf.int64), table_name="t",
      raise_non_finite=True)

  want = reference.row_sums_float32(positions, grads, rows)
  assert bool(finite)
  zeros = want == 0  # rows left out, and sums of -0.0 alone: +0.0
  assert zeros.sum() > 10 and not np.signbit(want[zeros]).any()
  np.testing.assert_array_equal(got.numpy().view(np.uint32),
                                want.view(np.uint32))


def test_dedup_gather_of_a_large_batch_matches_numpy():
  """Thousands of ids with heavy repetition (the hash table probes past
  occupied slots): distinct ids in order of first occurrence, each id's
  position among them and its row, as np.unique would give them."""
  rng = np.random.default_rng(3)
  vocab, dim = 50_000, 4
  storage_np = rng.normal(size=(vocab, dim)).astype(np.float32)
  storage = tf.Variable(storage_np)
  table = tfemb.TableConfig(vocab, dim, name="t")
  features = [(rng.zipf(1.3, size=n) * 7919 % vocab).astype(np.int64)
              for n in (4096, 3000, 1)]
  ids = np.concatenate(features)

  unique, positions, rows = fused_ops.dedup_gather(
      table, storage, [tf.constant(f) for f in features], ["a", "b", "c"])

  _, first = np.unique(ids, return_index=True)
  want_unique = ids[np.sort(first)]
  assert 1000 < len(want_unique) < len(ids) / 2  # many repeats, many rows
  np.testing.assert_array_equal(unique, want_unique)
  where = {int(v): k for k, v in enumerate(want_unique)}
  np.testing.assert_array_equal(positions, [where[int(v)] for v in ids])
  np.testing.assert_array_equal(rows, storage_np[ids])
