"""`tfemb.migrate`: TPUEstimator checkpoints restore into tfemb.TPUEmbedding.

The old checkpoints are written the way TPUEstimator wrote them
(tests/estimator_checkpoints.py).
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from estimator_checkpoints import DIM, HOSTS, SHARED, SUFFIXES, USER
from estimator_checkpoints import VIDEO, VOCAB
from estimator_checkpoints import mod_order, old_values
from estimator_checkpoints import save_estimator_checkpoint
import helpers
import tfemb
from tfemb import migrate
from tfemb.compat import v1
from tfemb.migrate import row_reader


def tfemb_embedding(tables, optimizer, module=tfemb, rows=VOCAB):
  """`{table name: feature}` -> a TPUEmbedding with those tables, trained
by `optimizer`'s case of tests/helpers.py."""
  return module.TPUEmbedding(
      {feature: module.FeatureConfig(module.TableConfig(rows, DIM, name=name))
       for name, feature in tables.items()},
      helpers.optimizer(optimizer, module))


def assert_restored(embedding, values, tables, optimizer):
  """Every table and slot equals the old checkpoint's, id by id."""
  got = {t.name: v for t, v in embedding.variables.items()}
  for variable, table in tables.items():
    np.testing.assert_array_equal(got[table]["parameters"].numpy(),
                                  values[variable], err_msg=table)
    assert set(got[table]) == {"parameters"} | set(SUFFIXES[optimizer])
    for slot, suffix in SUFFIXES[optimizer].items():
      np.testing.assert_array_equal(got[table][slot].numpy(),
                                    values[variable + suffix],
                                    err_msg=f"{table}/{slot}")


@pytest.mark.parametrize("strategy", ["div", "mod"])
@pytest.mark.parametrize("optimizer", list(SUFFIXES))
def test_feature_column_checkpoint_restores_into_tfemb(optimizer, strategy,
                                                       tmp_path):
  values = old_values([USER, SHARED], optimizer)
  old = save_estimator_checkpoint(str(tmp_path / "old" / "model.ckpt"),
                                  values, HOSTS, strategy)
  new = migrate.convert_checkpoint(
      old, str(tmp_path / "new" / "ckpt"), partition_strategy=strategy,
      block_rows=5, progress=None)
  tables = {USER: "tbl_user", SHARED: "tbl_item_query_shared_embedding"}
  embedding = tfemb_embedding({"tbl_user": "u",
                               "tbl_item_query_shared_embedding": "i"},
                              optimizer)
  status = tf.train.Checkpoint(embedding=embedding).restore(new)
  embedding.build()
  status.assert_consumed()
  assert_restored(embedding, values, tables, optimizer)
  # The keys are exactly those tfemb itself saves.
  saved = tf.train.Checkpoint(embedding=embedding).save(
      str(tmp_path / "resaved"))
  assert tf.train.list_variables(saved) == tf.train.list_variables(new)


def test_mixed_optimizers_and_named_tables(tmp_path):
  """Per-table optimizers (dict configs allowed them) and --table names."""
  values = {}
  for i, (name, optimizer) in enumerate(
      [(USER, "adagrad"), (VIDEO, "adam"), ("ads", "ftrl"), ("geo", "sgd")]):
    values.update(old_values([name], optimizer, seed=i))
  old = save_estimator_checkpoint(str(tmp_path / "old"), values, 2)
  tables = {USER: "users", VIDEO: "videos", "ads": "ads", "geo": "geo"}
  plan = migrate.describe(old, tables)
  assert {v: p.optimizer for v, p in plan.items()} == {
      USER: "Adagrad", VIDEO: "Adam", "ads": "FTRL", "geo": "SGD"}
  new = migrate.convert_checkpoint(old, str(tmp_path / "new"), tables=tables,
                                   root="model/embedding", progress=None)
  features = {
      "u": tfemb.FeatureConfig(tfemb.TableConfig(
          VOCAB, DIM, name="users", optimizer=tfemb.Adagrad(0.1))),
      "v": tfemb.FeatureConfig(tfemb.TableConfig(
          VOCAB, DIM, name="videos", optimizer=tfemb.Adam(0.1))),
      "a": tfemb.FeatureConfig(tfemb.TableConfig(
          VOCAB, DIM, name="ads", optimizer=tfemb.FTRL(0.1))),
      "g": tfemb.FeatureConfig(tfemb.TableConfig(VOCAB, DIM, name="geo")),
  }
  embedding = tfemb.TPUEmbedding(features, tfemb.SGD(0.1))
  model = tf.Module()
  model.embedding = embedding
  status = tf.train.Checkpoint(model=model).restore(new)
  embedding.build()
  status.assert_consumed()
  got = {t.name: v for t, v in embedding.variables.items()}
  for (variable, table), optimizer in zip(tables.items(),
                                          ["adagrad", "adam", "ftrl", "sgd"]):
    assert_restored(embedding, values, {variable: table}, optimizer)
    assert table in got


def test_tensorflows_own_tpu_embedding_restores_it(tmp_path):
  values = old_values([USER], "adagrad")
  old = save_estimator_checkpoint(str(tmp_path / "old"), values, HOSTS)
  new = migrate.convert_checkpoint(old, str(tmp_path / "new"), progress=None)
  tf_emb = tf.tpu.experimental.embedding
  theirs = tfemb_embedding({"tbl_user": "u"}, "adagrad", tf_emb)
  theirs = tf_emb.TPUEmbeddingForServing(theirs._feature_config,
                                         tf_emb.Adagrad(0.1))
  status = tf.train.Checkpoint(embedding=theirs).restore(new)
  theirs.build()
  status.assert_consumed()
  np.testing.assert_array_equal(
      theirs._variables["tbl_user"]["parameters"].numpy(), values[USER])
  np.testing.assert_array_equal(
      theirs._variables["tbl_user"]["accumulators"].numpy(),
      values[USER + "/Adagrad"])


def test_compat_spec_restores_the_converted_checkpoint(tmp_path):
  """EmbeddingConfigSpec and the converter agree on TPUEstimator's names."""
  fc = tf.feature_column
  user = fc.categorical_column_with_identity("user", VOCAB)
  items = [fc.categorical_column_with_identity(k, VOCAB)
           for k in ("item", "query")]
  columns = ([tf.compat.v1.tpu.experimental.embedding_column(user, DIM)] +
             tf.compat.v1.tpu.experimental.shared_embedding_columns(items,
                                                                    DIM))
  spec = v1.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=v1.AdagradParameters(0.1))
  values = old_values([USER, SHARED], "adagrad")
  old = save_estimator_checkpoint(str(tmp_path / "old"), values, HOSTS)
  new = migrate.convert_checkpoint(old, str(tmp_path / "new"), progress=None)
  embedding = spec.create_embedding()
  status = tf.train.Checkpoint(embedding=embedding).restore(new)
  embedding.build()
  status.assert_consumed()
  assert_restored(embedding, values,
                  {USER: "tbl_user", SHARED: "tbl_item_query_shared_embedding"},
                  "adagrad")


def test_reads_stream_in_blocks(tmp_path, monkeypatch):
  values = old_values([USER], "adam", rows=101)
  old = save_estimator_checkpoint(str(tmp_path / "old"), values, 4, "mod")
  reads = []
  original = row_reader.RowReader.read_rows

  def recording(self, name, start, count):
    reads.append((name, start, count))
    return original(self, name, start, count)

  monkeypatch.setattr(row_reader.RowReader, "read_rows", recording)
  new = migrate.convert_checkpoint(old, str(tmp_path / "new"),
                                   partition_strategy="mod", block_rows=8,
                                   progress=None)
  assert max(count for _, _, count in reads) <= 8
  for name in (USER, USER + "/Adam/m", USER + "/Adam/v"):
    rows = sorted(r for n, s, c in reads if n == name
                  for r in range(s, s + c))
    assert rows == list(range(101)), name  # every row read exactly once
  reader = tf.train.load_checkpoint(new)
  np.testing.assert_array_equal(
      reader.get_tensor("embedding/tbl_user/.ATTRIBUTES/VARIABLE_VALUE"),
      values[USER])
  np.testing.assert_array_equal(
      reader.get_tensor(
          "embedding/tbl_user.Svelocities/.ATTRIBUTES/VARIABLE_VALUE"),
      values[USER + "/Adam/v"])


def test_discovery_and_slices(tmp_path):
  values = old_values([USER, SHARED, VIDEO], "sgd")
  old = save_estimator_checkpoint(str(tmp_path / "old"), values, HOSTS)
  plan = migrate.describe(str(tmp_path))  # a directory: its latest
  assert {v: p.table for v, p in plan.items()} == {
      USER: "tbl_user", SHARED: "tbl_item_query_shared_embedding"}
  reader = row_reader.RowReader(old)
  assert reader.slice_rows(USER) == [8, 8, 7]
  assert reader.slice_rows("global_step") == []


def test_mod_needs_a_host_count_it_can_trust(tmp_path):
  values = old_values([USER], "sgd")
  whole = save_estimator_checkpoint(str(tmp_path / "whole"), values, 1)
  with pytest.raises(ValueError, match="give num_hosts"):
    migrate.convert_checkpoint(whole, str(tmp_path / "a"),
                               partition_strategy="mod", progress=None)
  # A whole (unsliced) copy of a 3-host "mod" table: num_hosts says how.
  stored = {USER: values[USER][mod_order(VOCAB, 3)]}
  whole = save_estimator_checkpoint(str(tmp_path / "whole3"), stored, 1)
  new = migrate.convert_checkpoint(whole, str(tmp_path / "b"),
                                   partition_strategy="mod", num_hosts=3,
                                   progress=None)
  np.testing.assert_array_equal(
      tf.train.load_checkpoint(new).get_tensor(
          "embedding/tbl_user/.ATTRIBUTES/VARIABLE_VALUE"), values[USER])
  sliced = save_estimator_checkpoint(str(tmp_path / "sliced"), values, 3,
                                     "mod")
  with pytest.raises(ValueError, match="saved in 3 host slices, not "
                     "num_hosts=2"):
    migrate.convert_checkpoint(sliced, str(tmp_path / "c"),
                               partition_strategy="mod", num_hosts=2,
                               progress=None)


def test_errors_name_the_variable(tmp_path):
  values = old_values([USER], "adam")
  del values[USER + "/Adam/v"]
  old = save_estimator_checkpoint(str(tmp_path / "old"), values, 2)
  with pytest.raises(ValueError, match=r"found Adam slot .* not its slot\(s\) "
                     r"\['velocities'\]"):
    migrate.convert_checkpoint(old, str(tmp_path / "new"), progress=None)
  with pytest.raises(ValueError, match="'global_step' is int64"):
    migrate.convert_checkpoint(old, str(tmp_path / "new"),
                               tables={"global_step": "steps"}, progress=None)
  with pytest.raises(ValueError, match=r"table\(s\) \['t'\]"):
    migrate.convert_checkpoint(old, str(tmp_path / "new"),
                               tables={USER: "t", "dense/kernel": "t"},
                               progress=None)
  with pytest.raises(ValueError, match="no embedding tables found"):
    migrate.convert_checkpoint(old, str(tmp_path / "new"), tables={},
                               progress=None)
  assert not os.path.exists(str(tmp_path / "new.partial"))


def test_cli_lists_converts_and_reports_progress(tmp_path, capsys):
  from tfemb.migrate import __main__ as cli  # pylint: disable=g-import-not-at-top
  values = old_values([USER, VIDEO], "ftrl")
  old = save_estimator_checkpoint(str(tmp_path / "old"), values, 2)
  assert cli.main([old, "--list"]) == 0
  listed = capsys.readouterr().out
  assert f"{USER} -> tbl_user  {VOCAB} x {DIM}  FTRL" in listed
  assert "dense/kernel" not in listed and VIDEO not in listed
  out = str(tmp_path / "new")
  tables = ["--table", USER, "--table", f"{VIDEO}=videos"]
  assert cli.main([old, "-o", out, "--block-rows", "10"] + tables) == 0
  printed = capsys.readouterr().out
  assert f"[2/2] {VIDEO} -> videos: {VOCAB} x {DIM}, FTRL" in printed
  assert f"tbl_user: {VOCAB}/{VOCAB} rows (100%)" in printed
  # The source's directory: its `checkpoint` file still names the source.
  assert tf.train.latest_checkpoint(str(tmp_path)) == old
  assert "checkpoint names another checkpoint and was left" in printed
  assert cli.main([old, "-o", out]) == 1
  assert "a checkpoint exists here; pass overwrite=True" in (
      capsys.readouterr().err)
  assert cli.main([old, "-o", out, "--overwrite", "-q"] + tables) == 0
  assert capsys.readouterr().out == ""
  embedding = tfemb.TPUEmbedding(
      {"u": tfemb.FeatureConfig(tfemb.TableConfig(VOCAB, DIM,
                                                  name="tbl_user")),
       "v": tfemb.FeatureConfig(tfemb.TableConfig(VOCAB, DIM,
                                                  name="videos"))},
      tfemb.FTRL(0.1))
  embedding.build()  # Restore into existing variables, this time.
  tf.train.Checkpoint(embedding=embedding).restore(out).assert_consumed()
  assert_restored(embedding, values, {USER: "tbl_user", VIDEO: "videos"},
                  "ftrl")


def test_python_dash_m_help():
  result = subprocess.run(
      [sys.executable, "-m", "tfemb.migrate", "--help"], capture_output=True,
      text=True, check=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert "usage: python -m tfemb.migrate" in result.stdout
  assert "--partition-strategy {div,mod}" in result.stdout
