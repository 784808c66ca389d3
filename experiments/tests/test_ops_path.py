"""experiments/ops_path.py: both host paths timed in alternating rounds, and
the rounds' arithmetic (experiments/v2_ab.py)."""

import json

import pytest
import tensorflow as tf

from experiments import ops_path
from experiments import v2_ab
from tfemb.host import table_paths


class _Step:
  """A step that records the order of its calls."""

  def __init__(self, name, calls):
    self.name, self.calls = name, calls

  def __call__(self, features, labels):
    self.calls.append(self.name)
    return tf.constant(0.0)


def test_alternate_reverses_the_order_every_round():
  calls = []
  built = {n: (_Step(n, calls), [(None, None)], 2) for n in ("a", "b")}
  rounds = list(v2_ab.alternate(built, rounds=3, calls=2))
  assert calls == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b",
                   "b"]
  assert len(rounds) == 3 and all(set(r) == {"a", "b"} for r in rounds)


def test_ratio_of_rounds_is_the_median_of_the_rounds_ratios():
  rounds = [{"a": 1.0, "b": 2.0}, {"a": 2.0, "b": 3.0},
            {"a": 4.0, "b": 20.0}]
  result = v2_ab.ratio_of_rounds(rounds, "a", "b")
  assert result["ratio"] == 2.0  # of 2, 1.5 and 5
  assert result["base_ms"] == 2.0 and result["other_ms"] == 3.0
  assert result["quartiles"] == [1.75, 3.5]


def test_times_the_ops_path_beside_the_fused_kernels(tmp_path, monkeypatch):
  traced = []
  for cls in (table_paths.OpsTable, table_paths.FusedTable):
    lookup = cls.lookup

    def counted(self, members, lookup=lookup):
      traced.append(type(self).__name__)
      return lookup(self, members)

    monkeypatch.setattr(cls, "lookup", counted)
  out = tmp_path / "ab.json"
  ops_path.main(["--api", "mid", "--optimizer", "adagrad", "--vocab", "1000",
                 "--rounds", "2", "--calls", "1", "--out", str(out)])
  result = json.loads(out.read_text())
  # Each engine's 8 tables, traced on its own path.
  assert traced.count("OpsTable") >= 8 and traced.count("FusedTable") >= 8
  assert len(result["rounds"]) == 2
  assert all(set(r) == {"fused", "ops"} for r in result["rounds"])
  assert result["ratio"] == pytest.approx(
      v2_ab.ratio_of_rounds(result["rounds"], "fused", "ops")["ratio"])
