"""The conformance runner (conformance/README.md) on a tree of its own
making: a suite's test files run unmodified under `python -m tfemb.run
--tpu TYPE`, import their helpers by TensorFlow's package path and read
absl flags as TensorFlow's tests do; the runner counts each outcome from
pytest's JUnit XML and names the tests that did not pass."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conformance import suites

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HELPER = '''
VALUE = 3
'''

TESTS = '''
from absl import flags
import tensorflow as tf

from tensorflow.python.tpu.tests import conformance_helper

flags.DEFINE_string("model_dir", None, "as TensorFlow's tests define it")
FLAGS = flags.FLAGS


def test_a_tpu_program_sees_its_tpu_type():
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
  tf.tpu.experimental.initialize_tpu_system(resolver)
  strategy = tf.distribute.TPUStrategy(resolver)
  assert strategy.num_replicas_in_sync == 8
  assert conformance_helper.VALUE == 3
  assert FLAGS.model_dir and FLAGS.model_dir != "None"


def test_that_fails():
  assert conformance_helper.VALUE == 4, "expected to fail"
'''


def _tree(tmp_path):
  tests = tmp_path / "tensorflow" / "python" / "tpu" / "tests"
  tests.mkdir(parents=True)
  (tests / "conformance_helper.py").write_text(textwrap.dedent(HELPER))
  (tests / "tpu_initialization_test.py").write_text(textwrap.dedent(TESTS))
  return tmp_path


def _run(*args):
  env = dict(os.environ, PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, "-m", "conformance", *args],
                        cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600, check=False)


def test_a_suite_runs_unmodified_files_and_counts_their_outcomes(tmp_path):
  tree, out = _tree(tmp_path / "tree"), tmp_path / "out"
  done = _run("--tensorflow", str(tree), "--suite",
              "tensorflow-initialization", "--out", str(out))
  assert done.returncode == 0, done.stdout + done.stderr
  assert ("tensorflow-initialization (v3-8): 1 passed, 1 failed, 0 skipped "
          "of 2") in done.stdout
  assert ("failed: tensorflow.python.tpu.tests.tpu_initialization_test::"
          "test_that_fails: AssertionError: expected to fail") in done.stdout
  (result,) = json.loads((out / "results.json").read_text())
  assert (result["passed"], result["failed"], result["finished"]) == (
      1, 1, True)
  failing = ("tensorflow.python.tpu.tests.tpu_initialization_test::"
             "test_that_fails")
  assert list(result["not_passed"]) == [failing]
  assert "expected to fail" in result["not_passed"][failing][1]


def test_a_tree_without_the_suites_files_is_reported_not_run(tmp_path):
  done = _run("--tensorflow", str(tmp_path), "--suite", "tensorflow-v1",
              "--out", str(tmp_path / "out"))
  assert done.returncode == 1
  assert "tensorflow-v1 (v5litepod-8): did not finish: no test files" in (
      done.stdout)


def test_the_suites_are_the_issues_types():
  types = {name: suite.tpu for name, suite in suites.SUITES.items()}
  assert types == {"tensorflow-v2": "v3-8", "tensorflow-v1": "v5litepod-8",
                   "tensorflow-v3": "v5p-8", "tensorflow-v3-one-chip": "v6e-1",
                   "tensorflow-initialization": "v3-8", "keras-rs": "v5p-8"}


def test_no_tree_given_is_a_usage_error():
  done = _run()
  assert done.returncode == 2
  assert "give --tensorflow DIR, --keras-rs DIR or both" in done.stderr


@pytest.mark.parametrize("name", sorted(suites.SUITES))
def test_each_suite_names_what_it_checks(name):
  assert suites.SUITES[name].what
