"""The numpy oracle: docs/numerics.md, written out in plain numpy.

This module is the only source of expected numbers in the tests (the rule:
tests/test_reference_only.py). It never imports tfemb. Inputs are plain
Python: per example, a list of ids and a list of weights.
"""

import numpy as np


# --- forward -----------------------------------------------------------------

def combine(table, rows, combiner, weights=None):
  """One combined row per example: sum of w*e, divided as the combiner says."""
  out = np.zeros((len(rows), table.shape[1]), np.float64)
  for b, ids in enumerate(rows):
    ws = np.ones(len(ids)) if weights is None else np.asarray(weights[b], float)
    if not len(ids):
      continue
    total = sum(w * table[i] for i, w in zip(ids, ws))
    if combiner == "mean":
      denom = ws.sum()
    elif combiner == "sqrtn":
      denom = np.sqrt((ws ** 2).sum())
    else:
      denom = 1.0
    out[b] = total / denom if denom else 0.0
  return out


def sequence(table, rows, length):
  """`[batch, length, dim]`: row p of example b is table[ids[p]], p < length."""
  out = np.zeros((len(rows), length, table.shape[1]), np.float64)
  for b, ids in enumerate(rows):
    for p, i in enumerate(ids[:length]):
      out[b, p] = table[i]
  return out


def contributions(rows, combiner, grad, weights=None, length=None):
  """(id, gradient) pairs a feature sends back to its table.

  `grad` is the gradient of the activations: `[batch, dim]`, or
  `[batch, length, dim]` for a sequence feature.
  """
  pairs = []
  for b, ids in enumerate(rows):
    if length is not None:
      pairs += [(i, grad[b, p]) for p, i in enumerate(ids[:length])]
      continue
    ws = np.ones(len(ids)) if weights is None else np.asarray(weights[b], float)
    if combiner == "mean":
      denom = ws.sum()
    elif combiner == "sqrtn":
      denom = np.sqrt((ws ** 2).sum())
    else:
      denom = 1.0
    for i, w in zip(ids, ws):
      pairs.append((i, grad[b] * (w / denom if denom else 0.0)))
  return pairs


def row_gradients(pairs):
  """Sums the contributions per distinct id: {id: gradient}."""
  grads = {}
  for i, g in pairs:
    grads[i] = grads.get(i, 0.0) + np.asarray(g, np.float64)
  return grads


def row_sums_float32(positions, grads, rows):
  """Per-id gradients summed per distinct row in float32, in the order of
  the ids, each row starting at zero (as tf.math.unsorted_segment_sum):
  [rows, dim]; a row no id reaches stays zero."""
  out = np.zeros((rows, grads.shape[1]), np.float32)
  for i, at in enumerate(positions):
    out[at] = out[at] + grads[i].astype(np.float32)
  return out


def dense(grads, shape):
  """{id: gradient} as one `shape` array: the gradient with respect to the
  whole table (a row no id looked up is zero)."""
  out = np.zeros(shape, np.float64)
  for i, g in grads.items():
    out[i] = g
  return out


def positional(table, rows, weights, valency):
  """A combiner with one trainable weight per position: example b gives
  sum over p < valency of weights[p] * table[ids[p]] (later ids dropped)."""
  out = np.zeros((len(rows), table.shape[1]), np.float64)
  for b, ids in enumerate(rows):
    for p, i in enumerate(ids[:valency]):
      out[b] += weights[p] * table[i]
  return out


def positional_gradients(table, rows, weights, valency, grad):
  """The gradients of `positional`: ((id, gradient) pairs for the table,
  `[valency]` gradient of the position weights)."""
  pairs, weight_grads = [], np.zeros(valency)
  for b, ids in enumerate(rows):
    for p, i in enumerate(ids[:valency]):
      pairs.append((i, weights[p] * np.asarray(grad[b], np.float64)))
      weight_grads[p] += np.asarray(grad[b], np.float64) @ table[i]
  return pairs, weight_grads


# --- ids of other dtypes ----------------------------------------------------

def cast_ids(values, bits):
  """docs/numerics.md, "Input dtypes": ids as TensorFlow's engine casts them
  to a `bits`-bit integer (64: the first generation's enqueue, 32: the
  SparseCore's). A float is truncated toward zero; an integer keeps its low
  `bits` bits, read as two's complement (2^32 + 3 is 3 in 32 bits, 2^31 is
  -2^31)."""
  out = []
  for v in values:
    i = int(v) & ((1 << bits) - 1)  # int() truncates a float toward zero
    out.append(i - (1 << bits) if i >> (bits - 1) else i)
  return out


def dealt_batches(elements, replicas, per_replica, steps):
  """docs/tpu.md, "Datasets": the batches a distributed dataset deals out,
  `[step][replica]`: the elements in order, `per_replica` to each replica
  in turn, replica k of a step the k-th slice (what TensorFlow's
  `MultiDeviceIterator` and the host TPU's iterator give)."""
  elements = list(elements)
  out = []
  for s in range(steps):
    step = []
    for r in range(replicas):
      first = (s * replicas + r) * per_replica
      step.append(elements[first:first + per_replica])
    out.append(step)
  return out


# --- the update --------------------------------------------------------------

def _clip(x, lo, hi):
  if lo is not None:
    x = np.maximum(x, lo)
  if hi is not None:
    x = np.minimum(x, hi)
  return x


def initial_slots(kind, params, shape):
  init = params.get("initial_accumulator_value", 0.1)
  return {
      "sgd": {},
      "adagrad": {"accumulators": np.full(shape, init)},
      "adagrad_momentum": {"accumulators": np.zeros(shape),
                           "momenta": np.zeros(shape)},
      "adam": {"momenta": np.zeros(shape), "velocities": np.zeros(shape)},
      "ftrl": {"accumulators": np.full(shape, init),
               "linears": np.zeros(shape)},
  }[kind]


def rule(kind, p, w, g, s, lr):
  """One optimizer update of one row (optimization_parameters.proto)."""
  if kind == "sgd":
    return w - lr * g, {}
  if kind == "adagrad":
    a = s["accumulators"] + g * g
    return w - lr * g / np.sqrt(a), {"accumulators": a}
  if kind == "adagrad_momentum":
    beta2, mom = p.get("beta2", 1.0), p.get("momentum", 0.0)
    if beta2 == 1:
      a = s["accumulators"] + g * g
    else:
      a = beta2 * s["accumulators"] + (1 - beta2) * g * g
    scaled = g * (a + p.get("epsilon", 1e-10)) ** (-1.0 / p.get("exponent", 2))
    m = mom * s["momenta"] + scaled
    step = mom * m + scaled if p.get("use_nesterov", False) else m
    return w - lr * step, {"accumulators": a, "momenta": m}
  if kind == "adam":
    b1, b2 = p.get("beta_1", 0.9), p.get("beta_2", 0.999)
    eps = p.get("epsilon", 1e-7)
    m = b1 * s["momenta"] + (1 - b1) * g
    v = b2 * s["velocities"] + (1 - b2) * g * g
    if p.get("sum_inside_sqrt", True):
      step = m / np.sqrt(v + eps * eps)
    else:
      step = m / (np.sqrt(v) + eps)
    return w - lr * step, {"momenta": m, "velocities": v}
  if kind == "ftrl":
    # FTRL-Proximal (McMahan et al. 2013, Algorithm 1) in TensorFlow's
    # accumulator form; the proto's `beta` adds beta/lr to the quadratic term.
    power = -p.get("learning_rate_power", -0.5)
    l1 = p.get("l1_regularization_strength", 0.0)
    l2 = p.get("l2_regularization_strength", 0.0)
    beta = p.get("beta", 0.0)
    n_old = s["accumulators"]
    n_new = n_old + g * g
    sigma = n_new ** power - n_old ** power
    if p.get("multiply_linear_by_learning_rate", False):
      z = s["linears"] + lr * g - sigma * w
      limit = l1 * lr
      quad = n_new ** power + 2 * l2 * lr + beta
    else:
      z = s["linears"] + g - sigma / lr * w
      limit = l1
      quad = n_new ** power / lr + 2 * l2 + beta / lr
    new_w = np.where(np.abs(z) > limit, (np.sign(z) * limit - z) / quad, 0.0)
    return new_w, {"accumulators": n_new, "linears": z}
  raise ValueError(kind)


def update_row(kind, p, w, g, s, lr):
  """Clip the gradient, apply the rule, decay the weights, clip them."""
  lo, hi = p.get("clip_gradient", (None, None))
  g = _clip(g, lo, hi)
  new_w, new_s = rule(kind, p, w, g, s, lr)
  d = p.get("weight_decay_factor")
  if d:
    if p.get("multiply_weight_decay_factor_by_learning_rate"):
      d = d * lr
    new_w = new_w - d * w
  new_w = _clip(new_w, p.get("clip_weight_min"), p.get("clip_weight_max"))
  return new_w, new_s


def adam_learning_rate(lr, beta_1, beta_2, t):
  """docs/numerics.md, 'Learning rates': Adam's bias correction folded into
  the learning rate of step `t` (counted from 1; an array gives each)."""
  return lr * np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)


class Table:
  """A table and its slots under one optimizer, updated the TPU's way."""

  def __init__(self, init, kind, params):
    self.w = np.asarray(init, np.float64).copy()
    self.kind, self.params = kind, params
    self.slots = initial_slots(kind, params, self.w.shape)

  def apply(self, grads, lr):
    """`grads`: {id: summed gradient}. Lazy: only those rows change, except
    non-lazy Adam, where every row takes a (possibly zero) gradient."""
    rows = list(grads)
    if self.kind == "adam" and not self.params.get("lazy_adam", True):
      rows = range(self.w.shape[0])
    for i in rows:
      g = grads.get(i, np.zeros(self.w.shape[1]))
      s = {k: v[i] for k, v in self.slots.items()}
      self.w[i], new_s = update_row(self.kind, self.params, self.w[i], g, s,
                                    lr)
      for k, v in new_s.items():
        self.slots[k][i] = v



# --- the SparseCore's stacked layout -----------------------------------------

def stacked_rows(vocabulary_size, num_sparse_cores, rotation, rows_per_shard,
                 row_offset):
  """docs/sparsecore.md, "Stacked tables and checkpoints": the row of its
  stacked variable where each id of a table sits. With N SparseCores, the
  table's rotation r, T rows per SparseCore shard and the table's offset o
  in each shard, id i sits in shard (i mod N + r) mod N, at row o + i div N
  of that shard:

    row(i) = ((i mod N + r) mod N) * T + o + i div N"""
  i = np.arange(vocabulary_size)
  n = num_sparse_cores
  return ((i % n + rotation) % n) * rows_per_shard + row_offset + i // n

# --- the SparseCore's id limits ----------------------------------------------

class SparseCoreFailure(Exception):
  """A batch the SparseCore fails (docs/sparsecore.md, "Id limits"), in
  stacked table `stack`: `kind` "ids" or "unique ids" (`count` over
  `limit` in `cell`, (SparseCore of the chip, partition)), "capacity"
  (a buffer of `count` ids, not a multiple of 8) or "buffer" (`count` ids
  do not fit in `limit`; `dropped` would be dropped)."""

  def __init__(self, stack, kind, count, limit, cell=None, dropped=None):
    super().__init__(stack, kind, count, limit, cell, dropped)
    self.stack, self.kind, self.count, self.limit = stack, kind, count, limit
    self.cell, self.dropped = cell, dropped


def sparse_core_limits(features, stacks, chips, limits, cores=4):
  """docs/sparsecore.md, "Id limits", on one chip's batch, id by id.

  `features`: in the engine's (flattened) order, each a dict: `stack`, its
  table's stacked table; `position`, its table's place in the stack (in
  name order); `rows`, per sample its ids. `stacks`: {stacked table: its
  samples (all its features')}, in TensorFlow's order. `limits`: dict of
  `max_ids` and `max_unique_ids` ({stacked table: limit}, 256 when
  missing), `per_sample` (max_ids_per_chip_per_sample) and `dropping`
  (allow_id_dropping).

  1. Sample k of S goes to SparseCore k // (S / cores); id i of the t-th
     table of a stack to partition (i + t * cores) mod N, N = chips *
     cores.
  2. Per SparseCore and partition, each (feature, sample, id) counts once;
     more ids, or more distinct (table, id), than the limits fail.
  3. SparseCore by SparseCore, partition by partition, table by table,
     id by id, then in input order, the ids fill a buffer of `per_sample`
     x samples, each partition's run starting at a multiple of 8; what
     does not fit fails, or is dropped (with every repeat of its id in
     its sample).

  Returns `(kept, dropped)`: per feature, per sample, whether each id is
  kept; per stacked table, the ids dropped. Raises `SparseCoreFailure`
  (the first failure, stacked table by stacked table in that order).
  """
  n = chips * cores
  entries = {stack: [] for stack in stacks}
  for f, feature in enumerate(features):
    rows, t = feature["rows"], feature["position"]
    seen, order = set(), 0
    for k, row in enumerate(rows):
      for i in row:
        if (k, i) not in seen:
          seen.add((k, i))
          core, part = k // (len(rows) // cores), (i + t * cores) % n
          entries[feature["stack"]].append((core, part, t, i, f, order, k))
        order += 1
  kept = [[[True] * len(row) for row in feature["rows"]]
          for feature in features]
  dropped = {}
  for stack, samples in stacks.items():
    ids, unique = {}, {}
    for core, part, t, i, *_ in entries[stack]:
      ids[core, part] = ids.get((core, part), 0) + 1
      unique.setdefault((core, part), set()).add((t, i))
    for core in range(cores):
      for part in range(n):
        for kind, count, limit in (
            ("ids", ids.get((core, part), 0),
             limits["max_ids"].get(stack, 256)),
            ("unique ids", len(unique.get((core, part), ())),
             limits["max_unique_ids"].get(stack, 256))):
          if count > limit:
            raise SparseCoreFailure(stack, kind, count, limit, (core, part))
    capacity = limits["per_sample"] * samples
    if capacity % 8:
      raise SparseCoreFailure(stack, "capacity", capacity, 8)
    filled, cell, gone = 0, None, []
    for core, part, _, i, f, _, k in sorted(entries[stack]):
      if (core, part) != cell:  # a partition's run starts at a multiple of 8
        cell, filled = (core, part), -(-filled // 8) * 8
      if filled < capacity:
        filled += 1
      else:
        gone.append((f, k, i))
    if gone and not limits["dropping"]:
      raise SparseCoreFailure(stack, "buffer", len(entries[stack]), capacity,
                              dropped=len(gone))
    for f, k, i in gone:
      row = features[f]["rows"][k]
      kept[f][k] = [keep and j != i for keep, j in zip(kept[f][k], row)]
    dropped[stack] = len(gone)
  return kept, dropped


def combine_kept(table, rows, kept, combiner, weights=None):
  """`combine` where a SparseCore dropped ids (`kept`: per example, a bool
  per id): the kept ids keep their gains over the whole example."""
  out = np.zeros((len(rows), table.shape[1]), np.float64)
  pairs = iter(contributions(rows, combiner, np.ones((len(rows), 1)),
                             weights))
  for b, ids in enumerate(rows):
    for keep in kept[b][:len(ids)]:
      i, gain = next(pairs)
      if keep:
        out[b] += gain[0] * table[i]
  return out


def kept_contributions(rows, kept, combiner, grad, weights=None):
  """`contributions` of the ids a SparseCore kept: dropped ids are not
  trained."""
  flat = [keep for example in kept for keep in example]
  return [pair for pair, keep in zip(
      contributions(rows, combiner, grad, weights), flat) if keep]


# --- a CustomOptimizer's computation -----------------------------------------

def row_norm_adagrad(table, seen, grads, lr):
  """The tests' row-norm `CustomOptimizer` (`_row_norm_slot` in
  tests/sparsecore/test_sparsecore_engine.py): Adagrad (docs/numerics.md,
  'Adagrad') with one accumulator per row, a slot of `slot_dims` 1
  (docs/sparsecore.md, `CustomOptimizer`). It runs on the touched rows,
  each with its summed gradient `g`:

    seen' = seen + sum_j g_j^2
    w'    = w - lr * g / sqrt(seen')

  `table`: `[rows, dim]`; `seen`: `[rows]`; `grads`: {id: summed gradient}.
  Returns the new (table, seen); other rows and their `seen` are kept."""
  w = np.asarray(table, np.float64).copy()
  seen = np.asarray(seen, np.float64).copy()
  for i, g in grads.items():
    seen[i] += (g * g).sum()
    w[i] -= lr * g / np.sqrt(seen[i])
  return w, seen


# --- a Keras head ------------------------------------------------------------

def mean_squared_error(labels, predictions):
  """Keras's "mse": the mean over the batch of (label - prediction)^2."""
  return np.mean((np.asarray(labels) - np.asarray(predictions)) ** 2)


def linear_head_step(x, kernel, labels, lr):
  """A Dense(1) head without bias (`kernel`: `[features, 1]`) on `x`,
  trained one step by SGD on the mean squared error (`mean_squared_error`).
  Returns (the loss, the kernel after the step)."""
  pred = (x @ kernel)[:, 0]
  loss = mean_squared_error(labels, pred)
  return loss, kernel - lr * x.T @ (2 * (pred - labels) / len(labels))[:, None]


# --- an exported ranking model -----------------------------------------------

def ranking_predictions(tables, features, head):
  """The export tests' ranking model (tests/exports.py) on `features`: per
  example, row `features["user"]` of table "users" and row
  `features["item"][:, 0]` of table "items" side by side (`tables`: by
  name), through a Dense(1) head (`head`: its kernel `[dims, 1]` and
  bias)."""
  kernel, bias = head
  act = np.concatenate([tables["users"][features["user"]],
                        tables["items"][features["item"][:, 0]]], axis=1)
  return act @ kernel + bias


# --- benchmarks/floor.cc's exact step -----------------------------------------

def floor_exact_steps(batches, grads, vocab, kind, p, lr, steps):
  """benchmarks/floor.cc's exact step, `steps` times, from tables and slots
  of zeros (float32, as floor.cc keeps them). Step k takes batch
  k mod len(batches); per table its ids' activations are read, their
  gradients summed per distinct row, and `rule(kind, p, ...)` applied once
  to each distinct row. `batches[b][t]`: table t's ids; `grads[b, t]`: one
  gradient row per id. Returns (the sum of every table's parameters, the
  sum of the last step's activations), in float64."""
  n_tables, dim = grads.shape[1], grads.shape[-1]
  shape = (n_tables, vocab, dim)
  w = np.zeros(shape, np.float32)
  slots = {name: s.astype(np.float32) for name, s in initial_slots(
      kind, {"initial_accumulator_value": 0.0}, shape).items()}
  activations = 0.0
  for step in range(steps):
    b = step % len(batches)
    activations = 0.0
    for t in range(n_tables):
      ids = batches[b][t]
      activations += w[t][ids].sum(dtype=np.float64)
      sums = np.zeros((vocab, dim), np.float32)
      np.add.at(sums, ids, grads[b, t])  # in id order, as floor.cc adds
      rows = np.unique(ids)
      new_w, new_s = rule(kind, p, w[t][rows], sums[rows],
                          {n: s[t][rows] for n, s in slots.items()}, lr)
      w[t][rows] = new_w
      for n, s in new_s.items():
        slots[n][t][rows] = s
  return w.sum(dtype=np.float64), activations
