"""`tfemb.tpu.plan`: the proto against TensorFlow's own, sizes by arithmetic.

TensorFlow's reference proto: its `TPUEmbedding` is constructed under a
stand-in `TPUStrategy` (tests/tpu_stand_in.py), so `__init__` takes its TPU
path (`_using_tpu`, dynamic learning rates, hosts); then the two steps of
`build` before the TPU is touched: `_get_and_update_output_shapes_from_input`
and `_create_config_proto`. The only change to TensorFlow's code is the
`low_dimensional_packing_status` cast (see `_tensorflow_proto`).
"""

import os
import subprocess
import sys

import pytest
import tensorflow as tf
from google import protobuf
from google.protobuf import text_format
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2
from tensorflow.python.tpu import tpu_embedding_v2_utils  # pylint: disable=g-direct-tensorflow-import

import helpers
import tfemb
from tfemb.tpu.planner import cli
from tfemb.tpu.planner import command_line
from tfemb.tpu.planner import report
from tpu_stand_in import EmbeddingFeature
from tpu_stand_in import StandInTPUStrategy
from tpu_stand_in import use_strategy

tf_embedding = tf.tpu.experimental.embedding


def _every_option(emb):
  """Five optimizers with non-default options, shared tables and learning
  rates, sequence, named and shaped features: in tfemb's classes or
  TensorFlow's (`emb`), which take the same arguments."""
  shared_rate = lambda: 0.3
  tables = [
      emb.TableConfig(1000, 8, name="items",
                      quantization_config=emb.QuantizationConfig(64, -2., 2.)),
      emb.TableConfig(50, 4, optimizer=emb.SGD(
          shared_rate, clipvalue=0.5, clip_weight_min=-1.0,
          weight_decay_factor=0.01,
          multiply_weight_decay_factor_by_learning_rate=True)),
      emb.TableConfig(7, 16, name="momentum", optimizer=emb.AdagradMomentum(
          0.2, momentum=0.9, use_nesterov=True, exponent=3, beta2=0.99,
          epsilon=1e-6, clipvalue=(None, 4.0),
          low_dimensional_packing_status=True)),
      emb.TableConfig(20, 2, name="adam", optimizer=emb.Adam(
          shared_rate, beta_1=0.8, beta_2=0.95, epsilon=1e-5,
          lazy_adam=False, sum_inside_sqrt=False, clip_weight_max=9.0)),
      emb.TableConfig(30, 4, name="ftrl", optimizer=emb.FTRL(
          lambda: 0.1, learning_rate_power=-0.25,
          l1_regularization_strength=0.1, l2_regularization_strength=0.2,
          beta=0.3, multiply_linear_by_learning_rate=True,
          allow_zero_accumulator=True, use_gradient_accumulation=False)),
      emb.TableConfig(10, 4, name="ftrl_defaults", optimizer=emb.FTRL()),
  ]
  feature_config = {
      "item": emb.FeatureConfig(tables[0], name="item"),
      "history": emb.FeatureConfig(tables[0], max_sequence_length=6),
      "context": [emb.FeatureConfig(t) for t in tables[1:]],
      "shaped": emb.FeatureConfig(tables[3], output_shape=[16, 3]),
  }
  return feature_config, emb.Adagrad(0.05)


def _tensorflow_proto(monkeypatch, feature_config, optimizer, num_replicas,
                      batch, num_hosts=1, num_cores_per_replica=None,
                      pipeline=False):
  """The proto TensorFlow's own TPUEmbedding builds (see module docstring).

  TF 2.21 assigns the optimizer's bool `low_dimensional_packing_status` to an
  enum field, which protobuf 7 refuses; TensorFlow's method runs unchanged
  with the bool cast to int (True -> 1 = ENABLED, False -> 0 = UNSPECIFIED),
  which is what protobuf used to do with a bool.
  """
  base = tpu_embedding_v2_utils._Optimizer  # pylint: disable=protected-access
  original = base._set_optimization_parameters  # pylint: disable=protected-access

  def with_int_status(self, parameters):
    status = self.low_dimensional_packing_status
    self.low_dimensional_packing_status = int(status)
    try:
      original(self, parameters)
    finally:
      self.low_dimensional_packing_status = status

  monkeypatch.setattr(base, "_set_optimization_parameters", with_int_status)
  use_strategy(monkeypatch, StandInTPUStrategy(
      EmbeddingFeature.V1, num_replicas, num_hosts, num_cores_per_replica))
  engine = tf_embedding.TPUEmbedding(feature_config, optimizer, pipeline)
  assert engine._using_tpu and len(engine._hosts) == num_hosts  # pylint: disable=protected-access
  engine._get_and_update_output_shapes_from_input(  # pylint: disable=protected-access
      per_replica_batch_size=batch)
  return engine._create_config_proto()  # pylint: disable=protected-access


def _assert_protos_equal(ours, theirs):
  assert (text_format.MessageToString(ours) ==
          text_format.MessageToString(theirs))
  assert ours == theirs
  assert ours.SerializeToString(deterministic=True) == (
      theirs.SerializeToString(deterministic=True))


@pytest.mark.parametrize("num_replicas, batch, num_hosts, cores, pipeline", [
    (8, 32, 1, None, False),
    (32, 16, 4, None, True),
    (16, 8, 2, 2, False),  # model parallelism: spmd_sharding
    (64, 4, 16, None, False),  # 16 hosts: tables of 7 and 10 rows padded
])
@pytest.mark.parametrize("given", ["tfemb", "tensorflow"])
def test_proto_equals_tensorflows(monkeypatch, given, num_replicas, batch,
                                  num_hosts, cores, pipeline):
  ours = tfemb.tpu.plan(
      *_every_option(tfemb if given == "tfemb" else tf_embedding),
      num_replicas, batch, num_hosts=num_hosts, num_cores_per_replica=cores,
      pipeline_execution_with_tensor_core=pipeline).proto
  theirs = _tensorflow_proto(monkeypatch, *_every_option(tf_embedding),
                             num_replicas, batch, num_hosts, cores, pipeline)
  _assert_protos_equal(ours, theirs)
  # What the comparison covers, read independently of both.
  # Tables in order of first use in tf.nest order ("context" < "history" <
  # "item" < "shaped"), the unnamed one named by its position.
  assert [t.name for t in theirs.table_descriptor] == [
      "table_0", "momentum", "adam", "ftrl", "ftrl_defaults", "items"]
  assert [t.vocabulary_size for t in theirs.table_descriptor] == [
      50, max(7, num_hosts), 20, 30, max(10, num_hosts), 1000]
  rates = [t.optimization_parameters.learning_rate for t in
           theirs.table_descriptor]
  assert [r.WhichOneof("learning_rate") for r in rates] == [
      "dynamic", "constant", "dynamic", "dynamic", "constant", "constant"]
  assert [rates[i].dynamic.tag for i in (0, 2, 3)] == [0, 0, 1]
  assert [list(f.input_shape) for f in theirs.feature_descriptor] == [
      [batch]] * 5 + [[batch, 6], [batch], [16, 3]]
  assert theirs.num_tensor_cores == num_replicas * (cores or 1)
  assert theirs.spmd_sharding.enabled == bool(cores)
  assert theirs.pipeline_execution_with_tensor_core == pipeline


def test_sequence_feature_with_its_own_output_shape(monkeypatch):
  def config(emb):
    table = emb.TableConfig(100, 4, name="t")
    return ({"a": emb.FeatureConfig(table, max_sequence_length=3,
                                    output_shape=[5, 2, 3])},
            emb.SGD(0.1))
  ours = tfemb.tpu.plan(*config(tfemb), 2, 5).proto
  theirs = _tensorflow_proto(monkeypatch, *config(tf_embedding), 2, 5)
  _assert_protos_equal(ours, theirs)
  assert list(ours.feature_descriptor[0].input_shape) == [5, 2, 3]


def test_tensorflow_cannot_build_its_proto_under_protobuf_7(monkeypatch):
  """Why `_tensorflow_proto` casts: TF's own call fails under protobuf 7
  (a TF bug; TF 2.21 installs it); the protobuf 4 to 6 of older TensorFlow
  releases store the bool as 0 or 1 (tfemb/tpu/planner/config_proto.py). Asserted
  for the installed protobuf."""
  use_strategy(monkeypatch, StandInTPUStrategy(EmbeddingFeature.V1, 8))
  table = tf_embedding.TableConfig(10, 2, name="t")
  engine = tf_embedding.TPUEmbedding(
      tf_embedding.FeatureConfig(table),
      tf_embedding.SGD(0.1, low_dimensional_packing_status=True))
  engine._get_and_update_output_shapes_from_input(per_replica_batch_size=4)  # pylint: disable=protected-access
  if int(protobuf.__version__.split(".")[0]) >= 7:
    with pytest.raises(TypeError, match="Expected an int, got a boolean"):
      engine._create_config_proto()  # pylint: disable=protected-access
  else:
    proto = engine._create_config_proto()  # pylint: disable=protected-access
    parameters = proto.table_descriptor[0].optimization_parameters
    assert parameters.low_dimensional_packing_status == 1  # ENABLED


def _sizes_config():
  feature_config = {
      "a": tfemb.FeatureConfig(tfemb.TableConfig(1000, 8, name="a")),
      "b": tfemb.FeatureConfig(tfemb.TableConfig(2, 4, name="b",
                                                 optimizer=tfemb.Adam(0.1))),
      "c": tfemb.FeatureConfig(tfemb.TableConfig(10, 2, name="c",
                                                 optimizer=tfemb.SGD(0.1))),
  }
  return feature_config, tfemb.Adagrad(0.1)


def test_sizes_per_table_host_and_chip():
  # 12 replicas on 3 hosts of 2 chips: 4 TensorCores per host, 2 per chip.
  result = tfemb.tpu.plan(*_sizes_config(), num_replicas=12,
                          per_replica_batch_size=4, num_hosts=3,
                          chips_per_host=2)
  a, b, c = result.tables
  # a: 1000 x 8 floats = 32000 bytes, Adagrad: one slot.
  assert (a.rows, a.dim, a.slots) == (1000, 8, ("accumulators",))
  assert (a.variable_bytes, a.slot_bytes) == (32000, {"accumulators": 32000})
  assert a.total_bytes == 64000
  # Host 0 holds ceil(1000 / 3) = 334 rows: 334 x 8 x 4 x 2 = 21376 bytes;
  # its 2 chips 167 rows each: 10688 bytes.
  assert (a.rows_per_host, a.bytes_per_host) == (334, 21376)
  assert (a.rows_per_chip, a.bytes_per_chip) == (167, 10688)
  # b: 2 x 4 floats = 32 bytes, Adam: momenta and velocities. Padded to 3
  # rows (one per host): 1 row per host and chip, 16 bytes x 3 variables.
  assert b.slot_bytes == {"momenta": 32, "velocities": 32}
  assert (b.total_bytes, b.bytes_per_host, b.bytes_per_chip) == (96, 48, 48)
  # c: 10 x 2 floats = 80 bytes, SGD: no slot. ceil(10 / 3) = 4 rows per host
  # (32 bytes), 2 per chip (16 bytes).
  assert (c.slots, c.total_bytes) == ((), 80)
  assert (c.bytes_per_host, c.bytes_per_chip) == (32, 16)
  assert result.total_bytes == 64000 + 96 + 80
  assert result.bytes_per_host == 21376 + 48 + 32
  assert result.bytes_per_chip == 10688 + 48 + 16


@pytest.mark.parametrize("optimizer, slots", [
    (tfemb.SGD(), ()), (tfemb.Adagrad(), ("accumulators",)),
    (tfemb.AdagradMomentum(), ("accumulators", "momenta")),
    (tfemb.Adam(), ("momenta", "velocities")),
    (tfemb.FTRL(), ("accumulators", "linears")),
    (tf_embedding.FTRL(), ("accumulators", "linears")),
])
def test_slots_of_each_optimizer(optimizer, slots):
  feature = tfemb.FeatureConfig(tfemb.TableConfig(3, 5, name="t"))
  (table,) = tfemb.tpu.plan(feature, optimizer, 1, 1).tables
  assert table.slots == slots
  assert table.total_bytes == 3 * 5 * 4 * (1 + len(slots))


def test_the_plan_changes_none_of_the_users_configs():
  table = tf_embedding.TableConfig(10, 2)
  feature_config = [tf_embedding.FeatureConfig(table)]
  result = tfemb.tpu.plan(feature_config, tf_embedding.SGD(0.1), 1, 2)
  assert result.tables[0].name == "table_0"
  assert table.name is None and table.optimizer is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_hosts=3), "num_hosts=3 must be >= 1 and divide the 8 "
     "TensorCores"),
    (dict(num_hosts=2, chips_per_host=3), "chips_per_host=3 must be >= 1 "
     "and divide the 4 TensorCores of a host"),
])
def test_topology_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    tfemb.tpu.plan(*_sizes_config(), 8, 4, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_replicas=0), r"num_replicas=0: expected an integer >= 1\."),
    (dict(num_replicas=-3), r"num_replicas=-3: expected an integer >= 1\."),
    (dict(num_replicas=True), r"num_replicas=True: expected an integer"),
    (dict(per_replica_batch_size=0),
     r"per_replica_batch_size=0: expected an integer >= 1 or None"),
    (dict(chips_per_host=0), r"chips_per_host=0: expected an integer >= 1 or "
     "None"),
    (dict(num_hosts=0), r"num_hosts=0: expected an integer >= 1\."),
    (dict(num_cores_per_replica=0.5), r"num_cores_per_replica=0.5: expected"),
])
def test_counts_must_be_positive_integers(kwargs, message):
  """0 is not "not given" (None is), and each error names its argument."""
  arguments = {"num_replicas": 8, "per_replica_batch_size": 4, **kwargs}
  with pytest.raises(ValueError, match=message):
    tfemb.tpu.plan(*_sizes_config(), **arguments)


def test_configuration_errors_name_the_table_or_feature():
  table = tfemb.TableConfig(10, 2, name="lonely")
  with pytest.raises(ValueError, match="Table 'lonely': the TPU needs an "
                     "embedding optimizer.*got NoneType"):
    tfemb.tpu.plan(tfemb.FeatureConfig(table), None, 1, 1)
  with pytest.raises(ValueError, match="Input Feature history has output "
                     "shape set as .* not fully defined"):
    tfemb.tpu.plan({"history": tfemb.FeatureConfig(table)}, tfemb.SGD(), 1)
  with pytest.raises(ValueError, match="feature item, Output shape is set to "
                     r"be \(3,\), But got incoming output shape \(4,\)"):
    tfemb.tpu.plan({"item": tfemb.FeatureConfig(table, output_shape=[3])},
                   tfemb.SGD(), 1, 4)
  twin = tfemb.TableConfig(5, 2, name="lonely")
  with pytest.raises(ValueError, match="Multiple tables with name lonely"):
    tfemb.tpu.plan([tfemb.FeatureConfig(table), tfemb.FeatureConfig(twin)],
                   tfemb.SGD(), 1, 1)
  custom = tfemb.CustomOptimizer(lambda g, w, s, lr, h: w - lr * g, 0.1)
  with pytest.raises(ValueError, match="Table 'lonely': a CustomOptimizer "
                     "trains only on a SparseCore.*tfemb.tpu sparsecore"):
    tfemb.tpu.plan(tfemb.FeatureConfig(table, output_shape=[4]), custom, 1)


def test_human_bytes():
  assert [report.human_bytes(n) for n in (0, 1023, 1536, 3 * 2**30)] == [
      "0 B", "1023 B", "1.5 KiB", "3.0 GiB"]


def test_report_lists_tables_totals_and_features():
  text = str(tfemb.tpu.plan(*_sizes_config(), num_replicas=12,
                            per_replica_batch_size=4, num_hosts=3,
                            chips_per_host=2))
  assert "12 replicas, 12 TensorCores on 3 host(s) x 2 chip(s)" in text
  assert "accumulators 31.2 KiB" in text  # 32000 / 1024
  assert "momenta 32 B, velocities 32 B" in text
  assert "all tables: 62.7 KiB (64,176 bytes)" in text
  assert "fullest host: 21.0 KiB (21,456 bytes)" in text
  assert "fullest chip: 10.5 KiB (10,752 bytes" in text
  assert [line.split() for line in text.splitlines()[-3:]] == [
      ["a", "a", "[4]"], ["b", "b", "[4]"], ["c", "c", "[4]"]]


_CONFIG_MODULE = '''
import tfemb

items = tfemb.TableConfig(1000, 8, name="items", optimizer=tfemb.SGD(0.1))
users = tfemb.TableConfig(100, 4, name="users")
FEATURES = {"item": tfemb.FeatureConfig(items)}

def model():
  return ({"item": tfemb.FeatureConfig(items),
           "user": tfemb.FeatureConfig(users)}, tfemb.Adam(0.1))
'''


_BAD_TARGETS = '''
NUMBER = 3

def broken():
  raise ZeroDivisionError("no model")
'''


def _written(directory):
  return sorted(set(os.listdir(directory)) - {"__pycache__"})


def _run_cli(tmp_path, capsys, target, *flags):
  module = tmp_path / "my_config.py"
  module.write_text(_CONFIG_MODULE)
  assert cli.main([f"{module}:{target}", "--num-replicas", "4",
                   "--per-replica-batch-size", "8", *flags]) == 0
  lines = capsys.readouterr().out.splitlines()
  return {line.split()[0]: line.split()[1:] for line in lines if line}


def test_cli_with_a_feature_config(tmp_path, capsys):
  rows = _run_cli(tmp_path, capsys, "FEATURES")
  # items: 1000 x 8 x 4 = 32000 bytes = 31.2 KiB; SGD, so no slot.
  assert rows["items"] == ["1,000", "8", "SGD", "31.2", "KiB", "-", "31.2",
                           "KiB", "31.2", "KiB", "7.8", "KiB"]
  assert "users" not in rows


def test_cli_with_a_function_and_proto_out(tmp_path, capsys):
  proto_out = tmp_path / "config.pbtxt"
  rows = _run_cli(tmp_path, capsys, "model", "--num-hosts", "2",
                  "--proto-out", str(proto_out))
  # users: 100 x 4 x 4 = 1600 bytes (1.5625 KiB) per variable; with Adam's
  # two slots 4800 (4.6875 KiB). A host: 50 rows, 2400 bytes (2.34 KiB); its
  # 2 chips (one TensorCore each) 25 rows, 1200 bytes (1.17 KiB).
  assert rows["users"] == [
      "100", "4", "Adam", "1.6", "KiB", "momenta", "1.6", "KiB,",
      "velocities", "1.6", "KiB", "4.7", "KiB", "2.3", "KiB", "1.2", "KiB"]
  assert rows["TPUEmbeddingConfiguration"] == ["written", "to",
                                               str(proto_out)]
  written = text_format.Parse(
      proto_out.read_text(),
      tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration())
  assert written == tfemb.tpu.plan(
      *command_line.configuration(
          "MODULE:ATTR", f"{tmp_path}/my_config.py:model"),
      4, 8, num_hosts=2).proto
  assert [t.name for t in written.table_descriptor] == ["items", "users"]


def test_cli_loads_a_pair_or_a_feature_config(tmp_path):
  module = tmp_path / "pair_config.py"
  module.write_text(_CONFIG_MODULE)
  feature_config, optimizer = command_line.configuration("MODULE:ATTR",
                                                         f"{module}:model")
  assert isinstance(optimizer, tfemb.Adam)
  assert sorted(feature_config) == ["item", "user"]
  feature_config, optimizer = command_line.configuration(
      "MODULE:ATTR", f"{module}:FEATURES")
  assert optimizer is None and list(feature_config) == ["item"]
  with pytest.raises(ValueError, match="expected MODULE:ATTR"):
    command_line.configuration("MODULE:ATTR", "no_colon")


@pytest.mark.parametrize("argv, line", [
    (["{m}:model", "--num-replicas", "0"],
     "argument --num-replicas: expected an integer >= 1, got '0'"),
    (["{m}:model", "--num-replicas", "-3"],
     "argument --num-replicas: expected an integer >= 1, got '-3'"),
    (["{m}:model", "--num-replicas", "x"],
     "argument --num-replicas: expected an integer >= 1, got 'x'"),
    (["{m}:model", "--num-replicas", "4", "--chips-per-host", "0"],
     "argument --chips-per-host: expected an integer >= 1, got '0'"),
    (["{m}:model", "--num-replicas", "4", "--per-replica-batch-size", "0"],
     "argument --per-replica-batch-size: expected an integer >= 1, got '0'"),
    (["{m}:model", "--num-replicas", "4", "--num-hosts", "3"],
     "--num-hosts 3 must be >= 1 and divide the 4 TensorCores "
     "(--num-replicas x --num-cores-per-replica)."),
    (["{m}", "--num-replicas", "4"], "argument MODULE:ATTR: expected "
     "MODULE:ATTR (e.g. my_model:features), got '{m}'"),
    (["no_such_module_47:model", "--num-replicas", "4"],
     "MODULE:ATTR: no module named 'no_such_module_47' (a module importable "
     "from the current directory, or a .py file)"),
    (["{d}/missing.py:model", "--num-replicas", "4"],
     "MODULE:ATTR: no file '{d}/missing.py'"),
    (["{m}:missing", "--num-replicas", "4"],
     "MODULE:ATTR: module '{m}' has no attribute 'missing'"),
    (["{m}:NUMBER", "--num-replicas", "4"],
     "MODULE:ATTR: feature_config[''] must be a FeatureConfig, got int."),
    (["{m}:broken", "--num-replicas", "4"],
     "MODULE:ATTR: calling {m}:broken raised ZeroDivisionError: no model\n"
     "(--debug shows the traceback)"),
    (["{m}:model", "--num-replicas", "4", "--per-replica-batch-size", "8",
      "--proto-out", "{d}/no_dir/config.pbtxt"],
     "--proto-out: cannot write '{d}/no_dir/config.pbtxt': no directory "
     "'{d}/no_dir'"),
    (["{m}:model", "--num-replicas", "4", "--per-replica-batch-size", "8",
      "--proto-out", "{d}"], "--proto-out: '{d}' is a directory; expected a "
     "file"),
])
def test_cli_bad_input_is_one_line_naming_the_argument(tmp_path, capsys, argv,
                                                       line):
  module = tmp_path / "my_config.py"
  module.write_text(_CONFIG_MODULE + _BAD_TARGETS)
  fill = dict(m=str(module), d=str(tmp_path))
  try:
    status = cli.main([a.format(**fill) for a in argv])
  except SystemExit as e:  # argparse's own errors
    status = e.code
  out, err = capsys.readouterr()
  assert status == 2 and out == ""
  assert err == f"python -m tfemb.tpu: error: {line.format(**fill)}\n"
  assert _written(tmp_path) == ["my_config.py"]  # nothing written


def test_cli_debug_raises_the_error(tmp_path):
  module = tmp_path / "my_config.py"
  module.write_text(_CONFIG_MODULE + _BAD_TARGETS)
  with pytest.raises(ValueError, match="no model") as raised:
    cli.main([f"{module}:broken", "--num-replicas", "4", "--debug"])
  assert isinstance(raised.value.__cause__, ZeroDivisionError)


def test_cli_writes_no_proto_it_cannot_write_whole(tmp_path, capsys,
                                                   monkeypatch):
  """A failed write leaves no file, and no report was printed."""
  module = tmp_path / "my_config.py"
  module.write_text(_CONFIG_MODULE)

  def full_disk(*_):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(os, "replace", full_disk)
  assert cli.main([f"{module}:model", "--num-replicas", "4",
                   "--per-replica-batch-size", "8", "--proto-out",
                   str(tmp_path / "config.pbtxt")]) == 2
  out, err = capsys.readouterr()
  assert out == "" and err == (
      f"python -m tfemb.tpu: error: --proto-out: cannot write "
      f"'{tmp_path}/config.pbtxt': No space left on device\n")
  assert _written(tmp_path) == ["my_config.py"]


def test_python_dash_m_tfemb_tpu(tmp_path):
  module = tmp_path / "my_config.py"
  module.write_text(_CONFIG_MODULE)
  done = subprocess.run(
      [sys.executable, "-m", "tfemb.tpu", f"{module}:model",
       "--num-replicas", "2", "--per-replica-batch-size", "3"],
      capture_output=True, text=True, check=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
      cwd=helpers.ROOT)
  rows = [line.split() for line in done.stdout.splitlines()]
  assert ["user", "users", "[3]"] in rows
  # Bad input: one line, status 2, no traceback (TensorFlow's own start-up
  # log lines aside).
  done = subprocess.run(
      [sys.executable, "-m", "tfemb.tpu", f"{module}:model",
       "--num-replicas", "2", "--proto-out", str(tmp_path / "no" / "p")],
      capture_output=True, text=True, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert done.returncode == 2 and done.stdout == ""
  assert "Traceback" not in done.stderr
  assert done.stderr.splitlines()[-1] == (
      f"python -m tfemb.tpu: error: --proto-out: cannot write "
      f"'{tmp_path}/no/p': no directory '{tmp_path}/no'")
