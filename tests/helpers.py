"""What the tests share: the repository's folders, a benchmark child run
as the suite runs it, the one table of
optimizers, Python lists of ids -> TensorFlow inputs, `CustomOptimizer`
computations, and how errors name features and tables."""

import contextlib
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import tensorflow as tf

import tfemb

# Test modules sit in folders that mirror tfemb/ (tests/host/, ...), at
# different depths: each finds the repository and the workers from here.
TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
WORKERS = TESTS / "workers"


def run_child(module, args, out):
  """`python -m module args --out out` from the repository root, as
  benchmarks.compare runs its children: checks it succeeded and returns
  the JSON it wrote."""
  result = subprocess.run(
      [sys.executable, "-m", module, *args, "--out", str(out)],
      cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
      capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(pathlib.Path(out).read_text())


# --- optimizers --------------------------------------------------------------

# The one table of optimizers the tests train, by case: (class name,
# arguments), every optimizer and option of docs/numerics.md. The classes
# have the same names and arguments in tfemb and in TensorFlow's
# tf.tpu.experimental.embedding (`optimizer(case, module)`); a test takes
# the cases it needs by name, and `reference_optimizer(case)` is the
# numpy reference's (tests/reference.py) view of the same case.
OPTIMIZERS = {
    "sgd": ("SGD", dict(learning_rate=0.3)),
    "sgd_clip_decay": ("SGD", dict(
        learning_rate=0.3, clipvalue=0.05, weight_decay_factor=0.2,
        multiply_weight_decay_factor_by_learning_rate=True,
        clip_weight_min=-0.45, clip_weight_max=0.4)),
    "adagrad": ("Adagrad", dict(learning_rate=0.2,
                                initial_accumulator_value=0.3)),
    "adagrad_halfclip_decay": ("Adagrad", dict(
        learning_rate=0.2, clipvalue=(None, 0.02), weight_decay_factor=0.05)),
    "adagrad_momentum": ("AdagradMomentum", dict(
        learning_rate=0.1, momentum=0.9, use_nesterov=False)),
    "adagrad_momentum_nesterov": ("AdagradMomentum", dict(
        learning_rate=0.1, momentum=0.7, use_nesterov=True, exponent=3.0,
        beta2=0.9, epsilon=1e-4, clipvalue=(-0.1, 0.2))),
    "adam": ("Adam", dict(learning_rate=0.05)),
    "adam_eps_outside": ("Adam", dict(
        learning_rate=0.05, beta_1=0.8, beta_2=0.9, epsilon=1e-3,
        sum_inside_sqrt=False, clip_weight_max=0.3,
        weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True)),
    "adam_non_lazy": ("Adam", dict(learning_rate=0.05, lazy_adam=False)),
    "ftrl": ("FTRL", dict(learning_rate=0.2, l1_regularization_strength=0.01,
                          l2_regularization_strength=0.02, beta=0.3)),
    "ftrl_power_linear_by_lr": ("FTRL", dict(
        learning_rate=0.2, learning_rate_power=-0.3,
        l1_regularization_strength=0.002, initial_accumulator_value=0.5,
        multiply_linear_by_learning_rate=True, clipvalue=1.0)),
    "ftrl_no_grad_accumulation": ("FTRL", dict(
        learning_rate=0.2, use_gradient_accumulation=False,
        allow_zero_accumulator=True)),
}

# One case of each optimizer, without clipping or weight decay.
ONE_PER_OPTIMIZER = ("sgd", "adagrad", "adagrad_momentum", "adam", "ftrl")
# The optimizers' classes, in the table's order.
OPTIMIZER_CLASSES = tuple(dict.fromkeys(c for c, _ in OPTIMIZERS.values()))
# The cases the fused kernels' row rules run: every case but non-lazy Adam,
# whose steps update every row.
LAZY_OPTIMIZERS = tuple(c for c in OPTIMIZERS if c != "adam_non_lazy")

# The reference's name of each optimizer class.
KIND = {"SGD": "sgd", "Adagrad": "adagrad", "AdagradMomentum":
        "adagrad_momentum", "Adam": "adam", "FTRL": "ftrl"}


def optimizer_arguments(case, without=()):
  """Case `case`'s arguments, less those named in `without`."""
  return {k: v for k, v in OPTIMIZERS[case][1].items() if k not in without}


def optimizer(case, module=tfemb, without=(), **changes):
  """Case `case` as an optimizer of `module`, its arguments less `without`
  and with `changes`."""
  return getattr(module, OPTIMIZERS[case][0])(
      **{**optimizer_arguments(case, without), **changes})


def reference_params(kwargs):
  """An optimizer's arguments as the reference's parameters: `clipvalue`
  (one bound or a (min, max) pair) becomes `clip_gradient`."""
  params = dict(kwargs)
  clip = kwargs.get("clipvalue")
  if clip is not None:
    params["clip_gradient"] = clip if isinstance(clip, tuple) else (-clip,
                                                                     clip)
  return params


def reference_optimizer(case, without=()):
  """`(kind, params)` of `reference.Table` for case `case` (less
  `without`); `params["learning_rate"]` is its learning rate."""
  return (KIND[OPTIMIZERS[case][0]],
          reference_params(optimizer_arguments(case, without)))


# --- inputs ------------------------------------------------------------------

def sparse(rows, values=None, dtype=tf.int64, width=None):
  """A rank 2 SparseTensor with example b holding `rows[b]`."""
  values = rows if values is None else values
  indices = [[b, j] for b, r in enumerate(rows) for j in range(len(r))]
  flat = [v for r in values for v in r]
  width = width or max([len(r) for r in rows] + [1])
  return tf.SparseTensor(
      indices=np.asarray(indices, np.int64).reshape(-1, 2),
      values=tf.constant(flat, dtype=dtype, shape=[len(flat)]),
      dense_shape=[len(rows), width])


def ragged(rows, dtype=tf.int64):
  return tf.RaggedTensor.from_row_lengths(
      tf.constant([v for r in rows for v in r], dtype=dtype,
                  shape=[sum(len(r) for r in rows)]),
      [len(r) for r in rows])


def random_rows(rng, batch, vocab, max_len, min_len=0):
  return [
      list(rng.integers(0, vocab, size=rng.integers(min_len, max_len + 1)))
      for _ in range(batch)
  ]


def random_weights(rng, rows):
  return [list(rng.uniform(0.2, 2.0, size=len(r))) for r in rows]


def sgd_computation(gradient, table, slots, learning_rate, hyperparameters):
  """A `CustomOptimizer`'s computation: SGD, slots and hyperparameters
  unused."""
  del slots, hyperparameters
  return table - learning_rate * gradient


def adagrad_like(gradient, embedding_table, slot_variables, learning_rate,
                 hyperparameters):
  """A `CustomOptimizer`'s computation: Adagrad with its learning rate
  scaled by the one hyperparameter (slot: the accumulator)."""
  (scale,) = hyperparameters
  accumulator = slot_variables[0] + gradient * gradient
  return (embedding_table - scale * learning_rate * gradient /
          tf.sqrt(accumulator), accumulator)


def assert_names(message, feature=None, table=None):
  """An error `message` names `feature` and `table` (None: not asked for),
  with no backslash-escaped quote (TensorFlow's Assert op escapes quotes,
  so tfemb's checks quote names in backticks). tfemb's own messages say
  "Feature `f` (table `t`)" or "Table `t`" (Python's errors may quote with
  '); TensorFlow's messages, which tfemb keeps, name a feature bare."""
  assert not re.search(r"\\['\"]", message), message
  q = "[`']"
  if table is not None:
    name = (rf"Table {q}{re.escape(table)}{q}" if feature is None else
            rf"Feature {q}{re.escape(feature)}{q} \(table "
            rf"{q}{re.escape(table)}{q}\)")
  elif feature is not None:
    name = rf"(?<![\w`']){q}?{re.escape(feature)}{q}?(?![\w`'])"
  else:
    return
  assert re.search(name, message), (name, message)


@contextlib.contextmanager
def host_tpu(tpu_type):
  """`tfemb.patch(tpu=tpu_type)` and the setup a TPU program makes, as
  Cloud TPU's guide makes it: yields the TPU strategy and its resolver."""
  patch = tfemb.patch(tpu=tpu_type)
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    yield tf.distribute.TPUStrategy(resolver), resolver
  finally:
    patch.undo()
