"""benchmarks/host_tpu.py's summary and benchmarks/host_tpu_profile.py's
attribution of executed ops, on made-up rows and op names (the scripts
themselves are run by hand, docs/performance.md)."""

import pytest

from benchmarks import host_tpu
from benchmarks import host_tpu_profile


def _row(kind, round_, step_ms, first=1.0, starts=(2.0,), traces=0):
  return {"kind": kind, "round": round_, "step_ms": step_ms,
          "first_step_s": first, "epoch_start_ms": list(starts),
          "traces_later_epochs": traces,
          "replicas": host_tpu.REPLICAS.get(kind, 1)}


def test_each_kind_is_set_against_the_cpu_branch_of_its_own_round():
  rows = [_row("cpu", 0, 2.0), _row("v3-8", 0, 8.0),
          _row("cpu", 1, 4.0), _row("v3-8", 1, 10.0, traces=1),
          _row("dense-cpu", 0, 1.0), _row("dense-mirrored-8", 0, 3.0),
          _row("dense-cpu", 1, 2.0), _row("dense-mirrored-8", 1, 4.0)]
  summary = host_tpu._summary(rows, ["cpu", "v3-8", "dense-cpu",  # pylint: disable=protected-access
                                     "dense-mirrored-8"])
  # Ratios per round (4.0 and 2.5), then their median; not 9.0 / 3.0.
  assert summary["v3-8"]["ratio"] == pytest.approx((4.0 + 2.5) / 2)
  assert summary["v3-8"]["step_ms"] == pytest.approx(9.0)
  assert summary["v3-8"]["traces_later_epochs"] == 1
  assert summary["v3-8"]["replicas"] == 8
  assert summary["dense-mirrored-8"]["ratio_to"] == "dense-cpu"
  assert summary["dense-mirrored-8"]["ratio"] == pytest.approx(
      (3.0 + 2.0) / 2)
  assert summary["cpu"]["ratio"] == pytest.approx(1.0)


def test_a_type_is_set_against_its_floors_of_its_own_round():
  rows = [_row("cpu", 0, 2.0), _row("v3-8", 0, 5.0), _row("v5p-8", 0, 3.0),
          _row("dense-cpu", 0, 1.0), _row("dense-mirrored-8", 0, 2.5),
          _row("dense-v3-8", 0, 2.0),
          _row("cpu", 1, 4.0), _row("v3-8", 1, 6.0), _row("v5p-8", 1, 5.0),
          _row("dense-cpu", 1, 2.0), _row("dense-mirrored-8", 1, 3.0),
          _row("dense-v3-8", 1, 4.0)]
  summary = host_tpu._summary(rows, [  # pylint: disable=protected-access
      "cpu", "v3-8", "v5p-8", "dense-cpu", "dense-mirrored-8", "dense-v3-8"])
  # MirroredStrategy: round 0's floor 2.0 + (2.5 - 1.0) = 3.5, round 1's
  # 4.0 + (3.0 - 2.0) = 5.0. The head as v3-8: 3.0 and 6.0.
  assert summary["v3-8"]["mirrored_floor_ratio"] == pytest.approx(
      (3.5 / 2.0 + 5.0 / 4.0) / 2)
  assert summary["v3-8"]["type_floor_ratio"] == pytest.approx(
      (3.0 / 2.0 + 6.0 / 4.0) / 2)
  assert summary["v3-8"]["above_type_floor_ms"] == pytest.approx(
      ((5.0 - 3.0) + (6.0 - 6.0)) / 2)
  # Nothing ran the head on 4 replicas: no floor for v5p-8.
  assert "mirrored_floor_ratio" not in summary["v5p-8"]
  assert "type_floor_ratio" not in summary["v5p-8"]
  assert summary["v5p-8"]["ratio"] == pytest.approx((1.5 + 1.25) / 2)
  assert summary["dense-v3-8"]["ratio_to"] == "dense-cpu"


PREFIX = ("while/body/_1/while/cond/then/_467/while/cond/"
          "StatefulPartitionedCall/")


@pytest.mark.parametrize("name,part", [
    (PREFIX + "replica_3/functional_1/concatenate_1/concat:ConcatV2",
     "keras_concat"),
    (PREFIX + "gradient_tape/replica_5/functional_1/concatenate_1/Slice_3:"
     "Slice", "keras_concat"),
    (PREFIX + "TfembApplyTables:TfembApplyTables", "embedding"),
    (PREFIX + "functional_1/tpu_embedding_1/split_6:SplitV", "embedding"),
    (PREFIX + "concat_7:ConcatV2", "embedding"),
    (PREFIX + "Assert_3:Assert", "embedding"),
    (PREFIX + "replica_1/functional_1/dense_1/Add:_MklNativeFusedMatMul",
     "dense"),
    (PREFIX + "adagrad/update_0/Add:AddV2", "dense"),
    (PREFIX + "replica_2/functional_1/tpu_embedding_1/Reshape_3/_12:_Send",
     "transfers"),
    ("MultiDeviceIteratorFromStringHandle:MultiDeviceIteratorFromString"
     "Handle", "input"),
    ("while/LoopCond/_117:_Recv", "loop"),
])
def test_executed_ops_are_attributed_to_their_part_of_the_step(name, part):
  assert host_tpu_profile.category(name) == part
