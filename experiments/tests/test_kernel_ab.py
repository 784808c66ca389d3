"""experiments.kernel_ab: a git revision's kernels beside the working tree's.

The renamed source must register every op under the base prefix (or the two
libraries would collide), the comparison must refuse builds that compute
different numbers, and a run must time both builds on the same tables.
"""

import json
import os
import re

import pytest

from experiments import kernel_ab

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))  # the repository
KERNELS = os.path.join(ROOT, "tfemb", "kernels", "src")
SOURCES = sorted(n for n in os.listdir(KERNELS) if n.endswith(".cc"))


def test_rename_moves_ops_kernels_and_namespace():
  source = ('namespace tfemb {\nnamespace {\n}  // namespace\n'
            'REGISTER_OP("TfembFoo")\n'
            'REGISTER_KERNEL_BUILDER(Name("TfembFoo").Device(DEVICE_CPU), F);\n'
            '}  // namespace tfemb\n'
            'const char* kept = "Tfemb stays in a message";\n')
  assert kernel_ab.rename(source) == (
      'namespace tfemb_base {\nnamespace {\n}  // namespace\n'
      'REGISTER_OP("TfembBaseFoo")\n'
      'REGISTER_KERNEL_BUILDER(Name("TfembBaseFoo").Device(DEVICE_CPU), F);\n'
      '}  // namespace tfemb_base\n'
      'const char* kept = "Tfemb stays in a message";\n')


@pytest.mark.parametrize("name", SOURCES)
def test_every_registered_op_of_the_sources_is_renamed(name):
  with open(os.path.join(KERNELS, name)) as f:
    source = f.read()
  ops = re.findall(r'REGISTER_OP\("(\w+)"\)', source)
  kernels = re.findall(r'Name\("(\w+)"\)', source)
  assert ops and kernels
  renamed = kernel_ab.rename(source)
  assert re.findall(r'REGISTER_OP\("(\w+)"\)', renamed) == [
      "TfembBase" + op[len("Tfemb"):] for op in ops]
  assert re.findall(r'Name\("(\w+)"\)', renamed) == [
      "TfembBase" + k[len("Tfemb"):] for k in kernels]
  assert "namespace tfemb " not in renamed.replace("{", " ")


def test_same_revision_times_both_builds_with_the_same_numbers(tmp_path):
  out = tmp_path / "ab.json"
  kernel_ab.main(["--base", "HEAD", "--optimizer", "adagrad", "--vocab",
                  "2000", "--rounds", "2", "--calls", "1", "--out",
                  str(out)])
  result = json.loads(out.read_text())
  assert result["base_ms"] > 0 and result["current_ms"] > 0
  assert result["ratio"] == pytest.approx(
      result["current_ms"] / result["base_ms"])


def test_builds_with_different_numbers_are_refused():
  import tensorflow as tf
  from tfemb.kernels import build

  class UpdatesTwice(kernel_ab.Renamed):
    """The base build, with every update applied twice."""

    def __getattr__(self, name):
      op = super().__getattr__(name)
      if name != "tfemb_apply_rows":
        return op
      return lambda **attrs: (op(**attrs), op(**attrs))[-1]

  base = UpdatesTwice(tf.load_op_library(kernel_ab.build_base("HEAD")))
  with pytest.raises(SystemExit, match="different numbers"):
    kernel_ab.check_same_numbers(base, build.load(), "sgd")
