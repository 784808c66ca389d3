"""Every fused op refuses bad input with an error, never a process abort.

Each case calls one raw op of the loaded build (`tfemb.kernels.fused_ops`) with a
wrong shape, dtype, attribute or range, and must raise
`tf.errors.InvalidArgumentError` (TensorFlow's kind for bad arguments) and
leave the variables it was given unchanged. The cases run in one subprocess
that prints a line per case as it goes: an op that aborts the process kills
only that subprocess, and the cases it did not reach fail here.
"""

import json
import os
import subprocess
import sys

import pytest

import helpers

ROOT = str(helpers.ROOT)

_SCRIPT = r'''
import json
import sys

import numpy as np
import tensorflow as tf

import tfemb
from tfemb.kernels import fused_ops

lib = fused_ops._library()
if lib is None:
  print(json.dumps({"case": "__build__", "ok": False}), flush=True)
  sys.exit(0)

SGD = dict(rule="SGD", hyperparameters=[], clip_gradient=[-np.inf, np.inf],
           clip_weight=[-np.inf, np.inf], weight_decay_factor=0.0,
           multiply_weight_decay_by_lr=False)
ADAGRAD = dict(SGD, rule="Adagrad")


def var(shape=(6, 2), dtype=np.float32):
  return tf.Variable(np.arange(np.prod(shape)).reshape(shape).astype(dtype))


def ids(*values):
  return tf.constant(values, tf.int64)


def gather(table, id_list, **kw):
  attrs = dict(vocabulary_size=6, dim=2, feature_names=["f"],
               table_name="t")
  attrs.update(kw)
  return lib.tfemb_dedup_gather(table=table.handle, ids=id_list, **attrs)


def apply(table, slots, id_tensor, grads, lr, attrs=SGD, **kw):
  """One part (table "t"); `id_tensor` and `grads` as lists: several."""
  id_list = id_tensor if isinstance(id_tensor, list) else [id_tensor]
  grad_list = grads if isinstance(grads, list) else [grads]
  kw.setdefault("table_names", ["t", "u"][:len(id_list)])
  return lib.tfemb_apply_rows(
      parameters=table.handle, slots=[s.handle for s in slots],
      ids=id_list, gradients=grad_list, learning_rate=lr,
      **dict(attrs, **kw))


def restore(table, slots, id_list, undo, keep=False, **kw):
  """TfembRestoreRows of parts `id_list` (tables "t", "u")."""
  kw.setdefault("table_names", ["t", "u"][:len(id_list)])
  return lib.tfemb_restore_rows(
      parameters=table.handle, slots=[s.handle for s in slots], ids=id_list,
      undo=undo, keep=tf.constant(keep), **kw)


def tables(variables, id_list, grads, lrs, go=True, attrs=SGD,
           positions=(), **kw):
  """TfembApplyTables of tables "t", "u", ... (`variables`: each table's,
  its parameters then its slots); with `positions`, `grads` per id."""
  kw.setdefault("table_names", ["t", "u"][:len(id_list)])
  return lib.tfemb_apply_tables(
      variables=[v.handle for v in variables], ids=id_list, gradients=grads,
      positions=list(positions), learning_rates=lrs,
      gradients_finite=tf.constant(go), **dict(attrs, **kw))


def row_gradients(grads, positions, unique):
  return lib.tfemb_row_gradients(gradients=grads, positions=positions,
                                 unique_ids=unique, table_name="t",
                                 raise_non_finite=True)


def counts(id_list, samples=None, **kw):
  """TfembIdCounts of one feature of 4 samples (2 cores, 2 partitions)."""
  attrs = dict(stacks=1, cores=2, partitions=2, count_distinct=True,
               feature_names=["f"], stack=[0], vocabulary=[6], rotation=[0],
               sizes=[4], first_id=[0])
  attrs.update(kw)
  return lib.tfemb_id_counts(
      ids=id_list, samples=samples or [tf.zeros([0], tf.int64)], **attrs)


def in_function(f, *args):
  """`f(*args)` in a tf.function whose inputs have unknown shapes, so that
  the kernel (not the shape function) sees them."""
  specs = [tf.TensorSpec(None, a.dtype) for a in args]

  def run(*inputs):
    out = f(*inputs)
    return None if isinstance(out, tf.Operation) else out

  return tf.function(run, input_signature=specs)(*args)


G2 = tf.ones([2, 2])
LR = tf.constant(0.1)
T = var()
S = var()
I32 = var(dtype=np.int32)
F64 = var(dtype=np.float64)
WIDE = var((6, 3))
SHORT = var((5, 2))
INTERLEAVED = var((6, 4))  # parameters and one Adagrad slot, dim 2

CASES = {
    # TfembDedupGather
    "gather_ids_matrix": (lambda: gather(T, [tf.zeros([2, 2], tf.int64)]),
                          [T]),
    "gather_ids_matrix_in_function": (
        lambda: in_function(lambda x: gather(T, [x]),
                            tf.zeros([2, 2], tf.int64)), [T]),
    "gather_id_out_of_range": (lambda: gather(T, [ids(1, 6)]), [T]),
    "gather_negative_id": (lambda: gather(T, [ids(-1)]), [T]),
    "gather_int_table": (lambda: gather(I32, [ids(1)]), [I32]),
    "gather_double_table": (lambda: gather(F64, [ids(1)]), [F64]),
    "gather_table_of_other_width": (lambda: gather(WIDE, [ids(1)]), [WIDE]),
    "gather_zero_dim": (lambda: gather(T, [ids(1)], dim=0), [T]),
    "gather_negative_dim": (lambda: gather(T, [ids(1)], dim=-2), [T]),
    "gather_negative_vocabulary": (
        lambda: gather(T, [ids(1)], vocabulary_size=-1), [T]),
    "gather_feature_names_count": (
        lambda: gather(T, [ids(1), ids(2)]), [T]),
    "gather_stacking_beyond_the_variable": (
        lambda: gather(T, [ids(5)], vocabulary_size=12,
                       stacked=[6, 2, 3, 1, 0]), [T]),
    "gather_negative_rotation": (
        lambda: gather(T, [ids(1)], stacked=[6, 2, 3, 0, -1]), [T]),
    # TfembIdCounts
    "counts_ids_matrix": (lambda: counts([tf.zeros([2, 2], tf.int64)]), []),
    "counts_id_out_of_range": (lambda: counts([ids(1, 6)]), []),
    "counts_negative_id": (lambda: counts([ids(-1)]), []),
    "counts_more_ids_than_samples": (lambda: counts([ids(1, 1, 1, 1, 1)]),
                                     []),
    "counts_sample_out_of_range": (lambda: counts([ids(1)], [ids(4)]), []),
    "counts_samples_mismatch": (lambda: counts([ids(1, 2)], [ids(0)]), []),
    "counts_feature_names_count": (
        lambda: counts([ids(1)], feature_names=["f", "g"]), []),
    "counts_stack_out_of_range": (lambda: counts([ids(1)], stack=[1]), []),
    "counts_zero_cores": (lambda: counts([ids(1)], cores=0), []),
    "counts_samples_not_per_core": (lambda: counts([ids(1)], sizes=[3]), []),
    "counts_negative_first_id": (lambda: counts([ids(1)], first_id=[-1]),
                                 []),
    "counts_cells_beyond_31_bits": (
        lambda: counts([ids(1)], stacks=2**20, partitions=2**10), []),
    "counts_limits_of_other_stacks": (
        lambda: counts([ids(1)], limit_names=["'t'", "'u'"], max_ids=[8, 8],
                       max_unique=[8, 8], stack_samples=[4, 4]), []),
    "counts_limits_lists_mismatch": (
        lambda: counts([ids(1)], limit_names=["'t'"], max_ids=[8],
                       max_unique=[8], stack_samples=[]), []),
    "counts_unique_limit_not_counted": (
        lambda: counts([ids(1)], count_distinct=False, limit_names=["'t'"],
                       max_ids=[8], max_unique=[2], stack_samples=[4]), []),
    # TfembRowGradients
    "row_gradients_vector_gradients": (
        lambda: row_gradients(tf.ones([2]), ids(0, 0), ids(1)), []),
    "row_gradients_matrix_positions": (
        lambda: row_gradients(G2, tf.zeros([2, 1], tf.int64), ids(1)), []),
    "row_gradients_matrix_unique_ids": (
        lambda: row_gradients(G2, ids(0, 0), tf.zeros([1, 1], tf.int64)),
        []),
    "row_gradients_rows_mismatch": (
        lambda: row_gradients(tf.ones([3, 2]), ids(0, 0), ids(1)), []),
    "row_gradients_position_out_of_range": (
        lambda: row_gradients(G2, ids(0, 1), ids(1)), []),
    "row_gradients_in_function": (
        lambda: in_function(row_gradients, tf.ones([2]), ids(0, 0), ids(1)),
        []),
    # TfembApplyRows
    "apply_vector_learning_rate": (
        lambda: apply(T, [], ids(0, 1), G2, tf.constant([0.1, 0.2])), [T]),
    "apply_vector_learning_rate_in_function": (
        lambda: in_function(lambda lr: apply(T, [], ids(0, 1), G2, lr),
                            tf.constant([0.1, 0.2])), [T]),
    "apply_empty_learning_rate": (
        lambda: apply(T, [], ids(0, 1), G2, tf.zeros([0])), [T]),
    "apply_ids_matrix": (
        lambda: apply(T, [], tf.zeros([2, 1], tf.int64), G2, LR), [T]),
    "apply_gradient_rows_mismatch": (
        lambda: apply(T, [], ids(0, 1, 2), G2, LR), [T]),
    "apply_gradient_vector": (
        lambda: apply(T, [], ids(0, 1), tf.ones([2]), LR), [T]),
    "apply_gradient_width_mismatch": (
        lambda: apply(T, [], ids(0, 1), tf.ones([2, 3]), LR), [T]),
    "apply_id_out_of_range": (lambda: apply(T, [], ids(0, 6), G2, LR), [T]),
    "apply_second_part_id_out_of_range": (
        lambda: apply(T, [], [ids(0, 1), ids(6)], [G2, tf.ones([1, 2])], LR),
        [T]),
    "apply_parts_of_other_widths": (
        lambda: apply(T, [], [ids(0, 1), ids(2)], [G2, tf.ones([1, 3])], LR),
        [T]),
    "apply_names_count": (
        lambda: apply(T, [], [ids(0), ids(1)], [tf.ones([1, 2])] * 2, LR,
                      table_names=["t"]), [T]),
    "apply_negative_id": (lambda: apply(T, [], ids(-1, 0), G2, LR), [T]),
    "apply_int_table": (lambda: apply(I32, [], ids(0, 1), G2, LR), [I32]),
    "apply_double_slot": (
        lambda: apply(T, [F64], ids(0, 1), G2, LR, ADAGRAD), [T, F64]),
    "apply_slot_of_other_rows": (
        lambda: apply(T, [SHORT], ids(0, 1), G2, LR, ADAGRAD), [T, SHORT]),
    "apply_slot_of_other_width": (
        lambda: apply(T, [WIDE], ids(0, 1), G2, LR, ADAGRAD), [T, WIDE]),
    "apply_missing_slot": (lambda: apply(T, [], ids(0, 1), G2, LR, ADAGRAD),
                           [T]),
    "apply_interleaved_of_other_width": (
        lambda: apply(WIDE, [], ids(0, 1), G2, LR, ADAGRAD,
                      interleaved=True), [WIDE]),
    "apply_interleaved_vector_learning_rate": (
        lambda: apply(INTERLEAVED, [], ids(0, 1), G2,
                      tf.constant([0.1, 0.2]), ADAGRAD, interleaved=True),
        [INTERLEAVED]),
    "apply_constants_count": (
        lambda: apply(T, [], ids(0, 1), G2, LR, hyperparameters=[1.0]), [T]),
    "apply_unknown_rule": (lambda: apply(T, [], ids(0, 1), G2, LR,
                                         rule="Nope"), [T]),
    "apply_clip_bounds": (lambda: apply(T, [], ids(0, 1), G2, LR,
                                        clip_gradient=[1.0]), [T]),
    # TfembApplyTables
    "tables_vector_learning_rate": (
        lambda: tables([T, S], [ids(0), ids(1)], [tf.ones([1, 2])] * 2,
                       [LR, tf.constant([0.1, 0.2])]), [T, S]),
    "tables_vector_gradients_finite": (
        lambda: tables([T], [ids(0, 1)], [G2], [LR], go=[True, True]), [T]),
    "tables_gradient_rows_mismatch": (
        lambda: tables([T, S], [ids(0, 1), ids(1)], [G2, G2], [LR, LR]),
        [T, S]),
    "tables_gradient_of_other_width": (
        lambda: tables([T], [ids(0, 1)], [tf.ones([2, 3])], [LR]), [T]),
    "tables_second_table_id_out_of_range": (
        lambda: tables([T, S], [ids(0, 1), ids(6)], [G2, tf.ones([1, 2])],
                       [LR, LR]), [T, S]),
    "tables_negative_id": (
        lambda: tables([T], [ids(-1, 0)], [G2], [LR]), [T]),
    "tables_int_table": (
        lambda: tables([T, I32], [ids(0), ids(1)], [tf.ones([1, 2])] * 2,
                       [LR, LR]), [T, I32]),
    "tables_slot_of_other_rows": (
        lambda: tables([T, SHORT], [ids(0, 1)], [G2], [LR], attrs=ADAGRAD),
        [T, SHORT]),
    "tables_missing_slot": (
        lambda: tables([T, S], [ids(0), ids(1)], [tf.ones([1, 2])] * 2,
                       [LR, LR], attrs=ADAGRAD), [T, S]),
    "tables_names_count": (
        lambda: tables([T, S], [ids(0), ids(1)], [tf.ones([1, 2])] * 2,
                       [LR, LR], table_names=["t"]), [T, S]),
    "tables_per_id_position_out_of_range": (
        lambda: tables([T, S], [ids(0, 1), ids(1)], [G2, tf.ones([3, 2])],
                       [LR, LR], positions=[ids(0, 1), ids(0, 1, 0)]),
        [T, S]),
    "tables_per_id_negative_position": (
        lambda: tables([T], [ids(0, 1)], [G2], [LR], positions=[ids(-1, 0)]),
        [T]),
    "tables_per_id_gradient_rows_mismatch": (
        lambda: tables([T], [ids(0, 1)], [G2], [LR],
                       positions=[ids(0, 1, 1)]), [T]),
    "tables_per_id_positions_matrix": (
        lambda: tables([T], [ids(0, 1)], [G2], [LR],
                       positions=[tf.zeros([2, 1], tf.int64)]), [T]),
    "tables_per_id_positions_count": (
        lambda: tables([T, S], [ids(0), ids(1)], [tf.ones([1, 2])] * 2,
                       [LR, LR], positions=[ids(0)]), [T, S]),
    "tables_per_id_gradient_not_finite_raising": (
        lambda: tables([T, S], [ids(0, 1), ids(1)],
                       [G2, tf.constant([[3e38, 1.0], [3e38, 1.0]])],
                       [LR, LR], positions=[ids(0, 1), ids(0, 0)],
                       raise_non_finite=True), [T, S]),
    "tables_interleaved_of_other_width": (
        lambda: tables([WIDE], [ids(0, 1)], [G2], [LR], attrs=ADAGRAD,
                       interleaved=True), [WIDE]),
    # TfembRestoreRows
    "restore_vector_keep": (
        lambda: restore(T, [], [ids(0, 1)], G2, keep=[False, False]), [T]),
    "restore_undo_rows_mismatch": (
        lambda: restore(T, [], [ids(0, 1, 2)], G2), [T]),
    "restore_second_part_rows_mismatch": (
        lambda: restore(T, [], [ids(0), ids(1)], tf.ones([1, 2])), [T]),
    "restore_undo_vector": (lambda: restore(T, [], [ids(0, 1)], tf.ones([2])),
                            [T]),
    "restore_undo_vector_in_function": (
        lambda: in_function(lambda u: restore(T, [], [ids(0, 1)], u),
                            tf.ones([4])), [T]),
    "restore_undo_of_other_width": (
        lambda: restore(T, [], [ids(0, 1)], tf.ones([2, 3])), [T]),
    "restore_undo_width_not_per_variable": (
        lambda: restore(T, [S], [ids(0, 1)], tf.ones([2, 3])), [T, S]),
    "restore_slot_of_other_rows": (
        lambda: restore(T, [SHORT], [ids(0, 1)], tf.ones([2, 4])),
        [T, SHORT]),
    "restore_id_out_of_range": (
        lambda: restore(T, [], [ids(0, 6)], G2), [T]),
    "restore_negative_id": (lambda: restore(T, [], [ids(-1)], tf.ones([1, 2])),
                            [T]),
    "restore_ids_matrix": (
        lambda: restore(T, [], [tf.zeros([2, 1], tf.int64)], G2), [T]),
    "restore_int_table": (lambda: restore(I32, [], [ids(0, 1)], G2), [I32]),
    "restore_names_count": (
        lambda: restore(T, [], [ids(0), ids(1)], G2, table_names=["t"]), [T]),
    # TfembReadColumns
    "read_columns_beyond_width": (
        lambda: lib.tfemb_read_columns(table=T.handle, begin=1, width=2),
        [T]),
    "read_columns_negative_width": (
        lambda: lib.tfemb_read_columns(table=T.handle, begin=0, width=-1),
        [T]),
    "read_columns_int_table": (
        lambda: lib.tfemb_read_columns(table=I32.handle, begin=0, width=1),
        [I32]),
    # TfembWriteColumns
    "write_columns_vector_row": (
        lambda: lib.tfemb_write_columns(table=T.handle, value=tf.ones([1, 2]),
                                        row=ids(0), begin=0), [T]),
    "write_columns_vector_row_in_function": (
        lambda: in_function(
            lambda r: lib.tfemb_write_columns(
                table=T.handle, value=tf.ones([1, 2]), row=r, begin=0),
            ids(0, 1)), [T]),
    "write_columns_scalar_value": (
        lambda: lib.tfemb_write_columns(table=T.handle, value=1.0,
                                        row=tf.constant(0, tf.int64),
                                        begin=0), [T]),
    "write_columns_rows_beyond": (
        lambda: lib.tfemb_write_columns(table=T.handle, value=tf.ones([2, 2]),
                                        row=tf.constant(5, tf.int64),
                                        begin=0), [T]),
    "write_columns_negative_row": (
        lambda: lib.tfemb_write_columns(table=T.handle, value=tf.ones([1, 2]),
                                        row=tf.constant(-1, tf.int64),
                                        begin=0), [T]),
    "write_columns_int_table": (
        lambda: lib.tfemb_write_columns(table=I32.handle,
                                        value=tf.ones([1, 1]),
                                        row=tf.constant(0, tf.int64),
                                        begin=0), [I32]),
    "write_columns_double_table": (
        lambda: lib.tfemb_write_columns(table=F64.handle,
                                        value=tf.ones([1, 1]),
                                        row=tf.constant(0, tf.int64),
                                        begin=0), [F64]),
    # TfembSplitColumns
    "split_columns_zero_parts": (
        lambda: lib.tfemb_split_columns(table=T.handle, parts=0), [T]),
    "split_columns_negative_parts": (
        lambda: lib.tfemb_split_columns(table=T.handle, parts=-2), [T]),
    "split_columns_uneven": (
        lambda: lib.tfemb_split_columns(table=WIDE.handle, parts=2), [WIDE]),
    "split_columns_int_table": (
        lambda: lib.tfemb_split_columns(table=I32.handle, parts=1), [I32]),
}

for name in sys.argv[1:] or CASES:
  run, variables = CASES[name]
  before = [v.numpy().copy() for v in variables]
  # Shared by every case: a previous case may not have changed them.
  error = None
  try:
    run()
  except Exception as e:  # pylint: disable=broad-except
    error = (type(e).__name__, str(e).splitlines()[0][:300])
  unchanged = all(np.array_equal(b, v.numpy())
                  for b, v in zip(before, variables))
  print(json.dumps({"case": name, "error": error, "unchanged": unchanged}),
        flush=True)
'''

# The SGD learning rate that is a vector, through the public API on the
# fused path: the step raises and the table keeps its values.
_API_SCRIPT = r'''
import json
import numpy as np
import tensorflow as tf
import tfemb

with tfemb.options.use(fused_kernels=True, interleaved_slots=False):
  table = tfemb.TableConfig(6, 2, name="t",
                            initializer=tf.constant_initializer(0.5))
  embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                 tfemb.SGD(lambda: tf.constant([0.1, 0.2])))
  embedding.build()
before = embedding.embedding_tables[table].numpy()
error = None
try:
  embedding.enqueue({"f": tf.constant([1, 2], tf.int64)}, training=True)
  activations = embedding.dequeue()
  embedding.apply_gradients({"f": tf.ones_like(activations["f"])})
except Exception as e:  # pylint: disable=broad-except
  error = [type(e).__name__, str(e).splitlines()[0][:300]]
after = embedding.embedding_tables[table].numpy()
print(json.dumps({"error": error,
                  "unchanged": bool(np.array_equal(before, after))}))
'''


def _run(script, *args):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  return subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=600,
                        check=False)


def _case_names():
  names = []
  cases = _SCRIPT.split("CASES = {", 1)[1].split("\n}\n", 1)[0]
  for line in cases.splitlines():
    line = line.strip()
    if line.startswith('"') and '":' in line:
      names.append(line.split('"')[1])
  return names


@pytest.fixture(scope="module")
def results():
  done = _run(_SCRIPT)
  out = {}
  for line in done.stdout.splitlines():
    if line.startswith("{"):
      record = json.loads(line)
      out[record["case"]] = record
  if out.get("__build__") is not None:
    pytest.skip("the fused kernels cannot be built here (no C++ compiler)")
  out["__exit__"] = (done.returncode, done.stderr[-2000:])
  return out


def test_the_cases_cover_every_op_with_inputs():
  names = _case_names()
  assert len(names) == len(set(names)) >= 40
  for op in ("gather", "counts", "row_gradients", "apply", "tables",
             "restore",
             "read_columns", "write_columns", "split_columns"):
    assert any(n.startswith(op + "_") for n in names), op


@pytest.mark.parametrize("case", _case_names())
def test_bad_input_is_an_invalid_argument_error(results, case):
  returncode, stderr = results["__exit__"]
  assert case in results, (
      f"the process died before this case (exit {returncode}): {stderr}")
  record = results[case]
  assert record["error"] is not None, "accepted"
  assert record["error"][0] == "InvalidArgumentError", record["error"]
  assert record["unchanged"], "a variable changed"


def test_the_subprocess_exits_cleanly(results):
  returncode, stderr = results["__exit__"]
  assert returncode == 0, stderr


def test_shape_functions_refuse_wrong_ranks_when_traced():
  """In a graph, the shapes known at trace time are checked as the op is
  added (TensorFlow raises ValueError there), before anything runs."""
  script = _SCRIPT.split("CASES = {", 1)[0] + r'''
import json
traced = {
    "gather": lambda: tf.function(
        lambda: gather(T, [tf.zeros([2, 2], tf.int64)])
    ).get_concrete_function(),
    "row_gradients": lambda: tf.function(
        lambda: row_gradients(tf.ones([2]), ids(0, 0), ids(1))
    ).get_concrete_function(),
    "apply_lr": lambda: tf.function(
        lambda: apply(T, [], ids(0, 1), G2, tf.constant([0.1, 0.2]))
    ).get_concrete_function(),
    "apply_rows": lambda: tf.function(
        lambda: apply(T, [], ids(0, 1, 2), G2, LR)).get_concrete_function(),
    "write_row": lambda: tf.function(
        lambda: lib.tfemb_write_columns(table=T.handle, value=tf.ones([1, 2]),
                                        row=ids(0), begin=0)
    ).get_concrete_function(),
    "restore_undo": lambda: tf.function(
        lambda: restore(T, [], [ids(0, 1)], tf.ones([4]))
    ).get_concrete_function(),
    "tables_lr": lambda: tf.function(
        lambda: tables([T], [ids(0, 1)], [G2], [tf.constant([0.1, 0.2])])
    ).get_concrete_function(),
    "tables_rows": lambda: tf.function(
        lambda: tables([T], [ids(0, 1, 2)], [G2], [LR])
    ).get_concrete_function(),
    "tables_per_id_rows": lambda: tf.function(
        lambda: tables([T], [ids(0, 1)], [G2], [LR], positions=[ids(0)])
    ).get_concrete_function(),
    "tables_positions_rank": lambda: tf.function(
        lambda: tables([T], [ids(0, 1)], [G2], [LR],
                       positions=[tf.zeros([2, 1], tf.int64)])
    ).get_concrete_function(),
}
for name, trace in traced.items():
  try:
    trace()
    error = None
  except Exception as e:  # pylint: disable=broad-except
    error = [type(e).__name__, str(e)]
  print(json.dumps({"case": name, "error": error}), flush=True)
'''
  done = _run(script)
  records = [json.loads(l) for l in done.stdout.splitlines()
             if l.startswith("{")]
  if any(r["case"] == "__build__" for r in records):
    pytest.skip("the fused kernels cannot be built here (no C++ compiler)")
  assert done.returncode == 0, done.stderr[-2000:]
  assert len(records) == 10, done.stderr[-2000:]
  for r in records:
    assert r["error"] is not None, r["case"]
    assert r["error"][0] == "ValueError", r
    assert "rank" in r["error"][1] or "must be equal" in r["error"][1], r


def test_a_vector_learning_rate_on_the_fused_path_raises():
  done = _run(_API_SCRIPT)
  assert done.returncode == 0, done.stderr[-2000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  assert out["error"] is not None
  # The kernel's InvalidArgumentError, or a check before it (a ValueError).
  assert out["error"][0] in ("InvalidArgumentError", "ValueError"), out
  helpers.assert_names(out["error"][1], table="t")
  assert out["unchanged"]
