"""TfembApplyTables: a step's update of several tables in one op, all or
nothing by itself.

Three Adagrad tables: "a" and "b" stacked in one variable of width 4
(disjoint rows), "c" in a variable of its own of width 6, each with its own
learning rate. A finite update gives the numpy reference's rows for every
table; where one table's update would overflow, no table changes; with
`gradients_finite` False nothing is computed or written. Separate slot
variables and an interleaved storage ([rows, (1 + slots) x dim]) alike.
With positions, the op takes one gradient row per id looked up and sums
them per distinct id itself: the reference sums them with numpy first.
"""

import numpy as np
import pytest
import tensorflow as tf

import reference
from tfemb.kernels import fused_ops

ROWS = 10
ADAGRAD = dict(rule="Adagrad", hyperparameters=[],
               clip_gradient=[-np.inf, np.inf],
               clip_weight=[-np.inf, np.inf], weight_decay_factor=0.0,
               multiply_weight_decay_by_lr=False)
# table: (its variable, its rows of it, learning rate)
TABLES = {"a": ("ab", [7, 1, 4], 0.1), "b": ("ab", [0, 9], 0.3),
          "c": ("c", [2, 5, 3, 8], 0.05)}
DIMS = {"ab": 4, "c": 6}


def _start(seed):
  """Each variable's parameters and accumulators, and each table's
  gradients."""
  rng = np.random.default_rng(seed)
  start = {v: (rng.normal(size=(ROWS, d)).astype(np.float32),
               rng.uniform(0.1, 1.0, size=(ROWS, d)).astype(np.float32))
           for v, d in DIMS.items()}
  grads = {t: rng.normal(size=(len(ids), DIMS[v])).astype(np.float32)
           for t, (v, ids, _) in TABLES.items()}
  return start, grads


class _Variables:
  """Each variable, with its accumulator beside it or apart."""

  def __init__(self, start, interleaved):
    self.interleaved = interleaved
    if interleaved:
      self.vars = {v: [tf.Variable(np.concatenate(s, axis=1))]
                   for v, s in start.items()}
    else:
      self.vars = {v: [tf.Variable(s[0]), tf.Variable(s[1])]
                   for v, s in start.items()}

  def values(self, v):
    """(parameters, accumulators) of variable `v`, as numpy."""
    if self.interleaved:
      both = self.vars[v][0].numpy()
      return both[:, :DIMS[v]], both[:, DIMS[v]:]
    return tuple(x.numpy() for x in self.vars[v])

  def apply(self, grads, gradients_finite=True, positions=None,
            raise_non_finite=False, pieces=None):
    """`grads` by table: one row per distinct id, or with `positions` (by
    table) one per id looked up; with `pieces` (by table, their rows), each
    table's given in pieces of those rows."""
    lib = fused_ops._library()  # pylint: disable=protected-access
    split = {t: np.split(grads[t], np.cumsum(pieces[t])[:-1]) if pieces
             else [grads[t]] for t in TABLES}
    finite = lib.tfemb_apply_tables(
        variables=[x.handle for v, _, _ in TABLES.values()
                   for x in self.vars[v]],
        ids=[tf.constant(ids, tf.int64) for _, ids, _ in TABLES.values()],
        gradients=[tf.constant(g) for t in TABLES for g in split[t]],
        gradient_pieces=[len(split[t]) for t in TABLES] if pieces else [],
        positions=[tf.constant(positions[t], tf.int64)
                   for t in TABLES] if positions else [],
        learning_rates=[tf.constant(lr) for _, _, lr in TABLES.values()],
        gradients_finite=tf.constant(gradients_finite),
        table_names=list(TABLES), interleaved=self.interleaved,
        raise_non_finite=raise_non_finite, **ADAGRAD)
    return [bool(f) for f in finite]


def _adagrad(start, grads):
  """The reference's Adagrad (tests/reference.py) on each table's rows, at
  its learning rate."""
  out = {v: [x.astype(np.float64) for x in s] for v, s in start.items()}
  for t, (v, ids, lr) in TABLES.items():
    w, acc = out[v]
    for i, row in zip(ids, grads[t].astype(np.float64)):
      w[i], s = reference.update_row("adagrad", {}, w[i], row,
                                     {"accumulators": acc[i]}, lr)
      acc[i] = s["accumulators"]
  return out


def _assert_unchanged(variables, start):
  for v in DIMS:
    for got, expected in zip(variables.values(v), start[v]):
      np.testing.assert_array_equal(got, expected, err_msg=v)


@pytest.fixture(params=[False, True], ids=["slot_variables", "interleaved"])
def interleaved(request):
  return request.param


def test_every_table_gets_its_rule_at_its_learning_rate(interleaved):
  start, grads = _start(0)
  variables = _Variables(start, interleaved)
  assert variables.apply(grads) == [True, True, True]
  want = _adagrad(start, grads)
  for v in DIMS:
    for got, expected in zip(variables.values(v), want[v]):
      np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6,
                                 err_msg=v)


@pytest.mark.parametrize("bad", list(TABLES))
def test_an_overflowing_table_leaves_every_table_unchanged(interleaved, bad):
  start, grads = _start(1)
  grads[bad][-1, 2] = 1e30  # its square overflows the accumulator
  variables = _Variables(start, interleaved)
  assert variables.apply(grads) == [t != bad for t in TABLES]
  _assert_unchanged(variables, start)


def test_gradients_not_finite_write_nothing(interleaved):
  start, grads = _start(2)
  variables = _Variables(start, interleaved)
  assert variables.apply(grads, gradients_finite=False) == [True] * 3
  _assert_unchanged(variables, start)


def test_an_id_outside_a_table_is_refused_naming_it_and_writes_nothing():
  start, grads = _start(3)
  variables = _Variables(start, False)
  saved = TABLES["c"]
  TABLES["c"] = ("c", [2, 5, 3, ROWS], 0.05)
  try:
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Table `c`: id 10 outside \[0, 10\)"):
      variables.apply(grads)
  finally:
    TABLES["c"] = saved
  _assert_unchanged(variables, start)


def _per_id(seed):
  """Each table's ids looked up as positions among its distinct ids (every
  distinct id at least once, most several times, in no order) and one
  gradient row per id looked up."""
  rng = np.random.default_rng(seed)
  positions, grads = {}, {}
  for t, (v, ids, _) in TABLES.items():
    pos = np.concatenate([np.arange(len(ids)),
                          rng.integers(0, len(ids), size=2 * len(ids) + 1)])
    positions[t] = rng.permutation(pos)
    grads[t] = rng.normal(size=(len(pos), DIMS[v])).astype(np.float32)
  return positions, grads


def _summed(positions, grads):
  """The reference's sum: each distinct id's rows added up (float64)."""
  out = {}
  for t, (_, ids, _) in TABLES.items():
    out[t] = np.zeros((len(ids), grads[t].shape[1]))
    np.add.at(out[t], positions[t], grads[t].astype(np.float64))
  return out


def test_per_id_gradients_are_summed_then_updated(interleaved):
  start, _ = _start(4)
  positions, grads = _per_id(4)
  variables = _Variables(start, interleaved)
  assert variables.apply(grads, positions=positions) == [True, True, True]
  want = _adagrad(start, _summed(positions, grads))
  for v in DIMS:
    for got, expected in zip(variables.values(v), want[v]):
      np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6,
                                 err_msg=v)


@pytest.mark.parametrize("raising", [False, True], ids=["skip", "raise"])
@pytest.mark.parametrize("bad", list(TABLES))
def test_a_gradient_summing_past_float32_leaves_every_table_unchanged(
    interleaved, bad, raising):
  # Two finite rows of one id whose sum overflows: the check is of the sum.
  start, _ = _start(5)
  positions, grads = _per_id(5)
  positions[bad][:2] = 0
  grads[bad][:2, 1] = 3e38
  assert np.isfinite(grads[bad]).all()
  variables = _Variables(start, interleaved)
  if raising:
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"Table `{bad}`: non-finite \(NaN or Inf\) "
                       "embedding gradient; no table was updated"):
      variables.apply(grads, positions=positions, raise_non_finite=True)
  else:
    assert variables.apply(grads, positions=positions) == [
        t != bad for t in TABLES]
  _assert_unchanged(variables, start)


def _pieces(positions, extra_row=None):
  """Each table's per-id rows cut in pieces: 3 rows, none, the rest (a host
  TPU's replicas' gradients); one row more in `extra_row`'s last piece."""
  return {t: [3, 0, len(positions[t]) - 3 + (t == extra_row)]
          for t in TABLES}


def test_per_id_gradients_in_pieces_are_summed_as_their_rows_joined(
    interleaved):
  start, _ = _start(6)
  positions, grads = _per_id(6)
  variables = _Variables(start, interleaved)
  assert variables.apply(grads, positions=positions,
                         pieces=_pieces(positions)) == [True, True, True]
  want = _adagrad(start, _summed(positions, grads))
  for v in DIMS:
    for got, expected in zip(variables.values(v), want[v]):
      np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6,
                                 err_msg=v)


def test_pieces_of_other_rows_than_the_ids_looked_up_are_refused_naming_it(
    interleaved):
  start, _ = _start(7)
  positions, grads = _per_id(7)
  grads["b"] = np.concatenate([grads["b"], grads["b"][:1]])
  variables = _Variables(start, interleaved)
  rows = len(positions["b"])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=rf"Table `b`: {rows} ids looked up but gradients "
                     rf"of {rows + 1} rows"):
    variables.apply(grads, positions=positions,
                    pieces=_pieces(positions, extra_row="b"))
  _assert_unchanged(variables, start)


def test_pieces_without_positions_are_refused():
  start, grads = _start(8)
  variables = _Variables(start, False)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="more than one piece only with positions"):
    variables.apply(grads, pieces={t: [1, len(grads[t]) - 1]
                                   for t in TABLES})
