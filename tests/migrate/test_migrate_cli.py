"""`python -m tfemb.migrate` refuses bad input with one line and no output.

Every case runs the command line as a user does (a subprocess) and checks
the exit status, that stderr holds exactly one line of the converter's own
(naming the file and the reason; TensorFlow's start-up log lines aside) and
no traceback, and that nothing was written at the output prefix.

The converter's processes run under Keras 3 whatever the pass's flavour
(the conversion uses no Keras; only its imports differ), so the module
runs in the Keras 3 pass only (`runs_under`); tests/migrate/test_migrate.py runs
the same conversions in process under both.
"""

import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from estimator_checkpoints import DIM, HOSTS, USER, VOCAB, VIDEO
from estimator_checkpoints import old_values, save_estimator_checkpoint
import helpers

ROOT = str(helpers.ROOT)
PROG = "python -m tfemb.migrate: error: "
# TensorFlow's own start-up lines on stderr, whatever the converter does.
_TF_LOG = re.compile(r"^([IWEF]\d{4} |WARNING: All log messages|To enable "
                     r"the following instructions)")


pytestmark = pytest.mark.runs_under("keras3")


def cli(*args):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="0",
             PYTHONPATH=ROOT)
  done = subprocess.run([sys.executable, "-m", "tfemb.migrate", *args],
                        cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300, check=False)
  return done.returncode, _own_lines(done.stderr), done.stdout


# A Python warning that an imported library (Keras on an older TensorFlow)
# prints at import: its line and the source line after it.
_WARNING = re.compile(r"^\S+\.py:\d+: \w*Warning: ")


def _own_lines(stderr):
  """stderr without TensorFlow's log lines and imported libraries'
  warnings: what the converter itself printed."""
  lines, skip_source = [], False
  for line in stderr.splitlines():
    if skip_source and line.startswith(" "):
      skip_source = False
      continue
    skip_source = bool(_WARNING.match(line)) and "tfemb" not in line
    if not skip_source and not _TF_LOG.match(line):
      lines.append(line)
  return lines


def assert_refused(args, path, reason, status=1):
  """One line naming `path` (a file or prefix) and matching `reason`."""
  code, lines, stdout = cli(*args)
  assert code == status, (code, lines, stdout)
  assert len(lines) == 1, lines
  assert lines[0].startswith(f"{PROG}{path}: "), lines[0]
  assert re.search(reason, lines[0]), lines[0]
  assert "wrote" not in stdout


def assert_no_output(prefix):
  assert glob.glob(glob.escape(prefix) + "*") == [], os.listdir(
      os.path.dirname(prefix))


def save_raw(prefix, tensors):
  """A checkpoint of `{name: value}` tensors, saved whole."""
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=list(tensors),
                    shape_and_slices=[""] * len(tensors),
                    tensors=list(tensors.values()))
  return prefix


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
  """A one-table checkpoint saved whole (as a 'mod' run's table can be)."""
  path = tmp_path_factory.mktemp("whole")
  return save_estimator_checkpoint(str(path / "model.ckpt"),
                                   old_values([USER], "sgd"), 1)


# One value per check in CI; the negative ones in the long suite.
@pytest.mark.parametrize("hosts", ["0", pytest.param("-1",
                                                     marks=pytest.mark.long)])
def test_num_hosts_below_one_is_refused(whole, hosts, tmp_path):
  out = str(tmp_path / "out")
  assert_refused([whole, "-o", out, "--partition-strategy", "mod",
                  "--num-hosts", hosts], whole,
                 rf"num_hosts \(--num-hosts\) must be at least 1, got {hosts}")
  assert_no_output(out)


@pytest.mark.parametrize("rows", ["0", pytest.param("-3",
                                                    marks=pytest.mark.long)])
def test_block_rows_below_one_is_refused(whole, rows, tmp_path):
  out = str(tmp_path / "out")
  assert_refused([whole, "-o", out, "--block-rows", rows], whole,
                 rf"block_rows \(--block-rows\) must be at least 1, got {rows}")
  assert_no_output(out)


@pytest.mark.parametrize("shape", [(0, DIM), (VOCAB, 0)],
                         ids=["no_rows", "no_columns"])
def test_an_empty_table_is_refused(shape, tmp_path):
  old = save_raw(str(tmp_path / "old"), {USER: np.zeros(shape, np.float32)})
  out = str(tmp_path / "out")
  assert_refused([old, "-o", out], old,
                 rf"{re.escape(repr(USER))} has shape \[{shape[0]}, "
                 rf"{shape[1]}\]; an embedding table has at least one row")
  assert_no_output(out)
  assert_refused([old, "--list"], old, "at least one row and one column")


@pytest.mark.long  # the suite's time: CI's refusals cover a bad input file
def test_random_bytes_name_the_file_that_is_not_a_checkpoint(tmp_path):
  rng = np.random.default_rng(0)
  (tmp_path / "junk.index").write_bytes(rng.bytes(4000))
  (tmp_path / "noise").write_bytes(rng.bytes(4000))
  out = str(tmp_path / "out")
  junk = str(tmp_path / "junk")
  assert_refused([junk, "-o", out], junk + ".index",
                 r"not a TensorFlow checkpoint \(not an sstable")
  noise = str(tmp_path / "noise")
  assert_refused([noise, "-o", out], noise, "not a TensorFlow checkpoint")
  assert_refused([str(tmp_path / "absent"), "-o", out],
                 str(tmp_path / "absent"), "no checkpoint here")
  model_dir = tmp_path / "model_dir"  # a directory's state file, damaged
  model_dir.mkdir()
  (model_dir / "checkpoint").write_bytes(b"\xc6\x00" + rng.bytes(100))
  assert_refused([str(model_dir), "-o", out], str(model_dir / "checkpoint"),
                 "not a checkpoint state file")
  assert_refused([str(model_dir), "--list"], str(model_dir / "checkpoint"),
                 "not a checkpoint state file")
  assert_no_output(out)


def test_a_failure_while_copying_leaves_no_output(tmp_path):
  """Rows unreadable half way (a truncated data file): no checkpoint at the
  output, and one being replaced (--overwrite) stays as it was."""
  values = old_values([USER, VIDEO], "adagrad")
  old = save_estimator_checkpoint(str(tmp_path / "old"), values, HOSTS)
  out = str(tmp_path / "new")
  tables = ["--table", USER, "--table", VIDEO, "-q"]
  code, lines, _ = cli(old, "-o", out, *tables)
  assert (code, lines) == (0, [])
  before = {p: open(p, "rb").read() for p in glob.glob(out + "*")}
  data, = glob.glob(old + ".data-*")
  with open(data, "r+b") as f:
    f.truncate(os.path.getsize(data) // 2)
  unreadable = r"Variable '.*': rows \[\d+, \d+\) cannot be read \(.+\)\.$"
  assert_refused([old, "-o", out, "--overwrite", "--block-rows", "4"] +
                 tables, old, unreadable)
  assert {p: open(p, "rb").read() for p in glob.glob(out + "*")} == before
  fresh = str(tmp_path / "fresh")
  assert_refused([old, "-o", fresh, "--block-rows", "4"] + tables, old,
                 unreadable)
  assert_no_output(fresh)


def test_converting_into_the_estimators_model_dir(tmp_path):
  """`-o model_dir/tfemb` leaves model_dir/checkpoint alone: `--list` of
  the directory still finds the TPUEstimator's tables."""
  model_dir = tmp_path / "model_dir"
  values = old_values([USER], "adagrad")
  old = save_estimator_checkpoint(str(model_dir / "model.ckpt"), values,
                                  HOSTS)
  state = (model_dir / "checkpoint").read_bytes()
  out = str(model_dir / "tfemb")
  code, lines, stdout = cli(str(model_dir), "-o", out)
  assert (code, lines) == (0, []), stdout
  assert "names another checkpoint and was left as it was" in stdout
  assert (model_dir / "checkpoint").read_bytes() == state
  assert tf.train.latest_checkpoint(str(model_dir)) == old
  code, lines, stdout = cli(str(model_dir), "--list")
  assert (code, lines) == (0, [])
  assert f"{USER} -> tbl_user  {VOCAB} x {DIM}  Adagrad" in stdout
  np.testing.assert_array_equal(
      tf.train.load_checkpoint(out).get_tensor(
          "embedding/tbl_user/.ATTRIBUTES/VARIABLE_VALUE"), values[USER])


def test_the_source_is_never_the_output(whole):
  index = open(whole + ".index", "rb").read()
  assert_refused([whole, "-o", whole, "--overwrite"], whole,
                 "is the checkpoint being converted")
  assert open(whole + ".index", "rb").read() == index


def test_an_existing_output_is_kept_without_overwrite(whole, tmp_path):
  out = str(tmp_path / "out")
  assert cli(whole, "-o", out, "-q")[:2] == (0, [])
  index = open(out + ".index", "rb").read()
  assert_refused([whole, "-o", out], out,
                 r"a checkpoint exists here; pass overwrite=True "
                 r"\(--overwrite\)")
  assert open(out + ".index", "rb").read() == index


def test_debug_shows_the_traceback(whole, tmp_path):
  code, lines, _ = cli(whole, "-o", str(tmp_path / "out"), "--block-rows",
                       "0", "--debug")
  assert code == 1
  assert lines[0] == "Traceback (most recent call last):"
  assert "ConversionError" in lines[-1] and "block_rows" in lines[-1]


def test_argument_errors_are_one_line(whole):
  code, lines, _ = cli(whole, "-o", "x", "--num-hosts", "many")
  assert code == 2
  assert lines == [f"{PROG}argument --num-hosts: invalid int value: 'many'"]
  code, lines, _ = cli(whole)
  assert (code, lines) == (2, [f"{PROG}--output is required (or --list)"])
