"""TensorFlow's ops compute the fused kernels' bits (docs/numerics.md,
'Precision'): every optimizer and every option that changes the
arithmetic, trained for a few steps on each path, leaves the same table
and slots, bit for bit. The one exception is a power (AdagradMomentum's,
FTRL's other than the square root): glibc's `powf` in the kernels is not
correctly rounded, so one power in about 1600 is 1 ulp away.

Rows 16 floats wide fill whole SIMD registers; rows 37 wide end in a
partial one, and so do the step's rows as one tensor (TensorFlow's CPU
kernels compute a tensor's tail apart). Gradients span nine decades, ids
repeat within a step, and the learning rate is a constant (which a
`tf.function` folds into the graph) or read from a variable every step.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import reference
import tfemb
from tfemb.kernels import build

VOCAB, BATCH, STEPS, LR = 53, 71, 3, 0.05
UNTOUCHED = 5  # the last rows: no id reaches them
DIMS = (16, 37)

CASES = {
    "sgd": ("SGD", {}),
    "sgd_clip_decay": ("SGD", dict(
        clipvalue=0.5, weight_decay_factor=0.3, clip_weight_min=-0.6,
        clip_weight_max=0.5)),
    "adagrad": ("Adagrad", dict(initial_accumulator_value=0.3)),
    "adagrad_halfclip_decay_by_lr": ("Adagrad", dict(
        clipvalue=(None, 2.0), weight_decay_factor=0.2,
        multiply_weight_decay_factor_by_learning_rate=True)),
    "adagrad_momentum": ("AdagradMomentum", dict(momentum=0.9)),
    "adagrad_momentum_off": ("AdagradMomentum", dict(momentum=0.0)),
    "adagrad_momentum_nesterov": ("AdagradMomentum", dict(
        momentum=0.7, use_nesterov=True)),
    "adagrad_momentum_exponent_3_beta2": ("AdagradMomentum", dict(
        momentum=0.8, exponent=3.0, beta2=0.9, epsilon=1e-4)),
    "adagrad_momentum_nesterov_beta2_clip": ("AdagradMomentum", dict(
        momentum=0.6, use_nesterov=True, beta2=0.99, epsilon=1e-6,
        clipvalue=(-3.0, 1.0), clip_weight_max=0.4)),
    "adam": ("Adam", {}),
    "adam_eps_outside": ("Adam", dict(
        beta_1=0.8, beta_2=0.9, epsilon=1e-3, sum_inside_sqrt=False)),
    "adam_clip_decay": ("Adam", dict(
        clipvalue=0.3, weight_decay_factor=0.1, clip_weight_min=-0.5)),
    "adam_non_lazy": ("Adam", dict(lazy_adam=False)),
    "adam_non_lazy_eps_outside_decay_by_lr": ("Adam", dict(
        lazy_adam=False, sum_inside_sqrt=False, weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True)),
    "ftrl": ("FTRL", dict(l1_regularization_strength=0.01,
                          l2_regularization_strength=0.02)),
    "ftrl_beta": ("FTRL", dict(l1_regularization_strength=0.001,
                               l2_regularization_strength=0.1, beta=0.3)),
    "ftrl_linear_by_lr": ("FTRL", dict(
        l1_regularization_strength=0.002, l2_regularization_strength=0.03,
        beta=0.2, multiply_linear_by_learning_rate=True)),
    "ftrl_power": ("FTRL", dict(
        learning_rate_power=-0.3, l1_regularization_strength=0.002,
        initial_accumulator_value=0.5)),
    "ftrl_power_linear_by_lr": ("FTRL", dict(
        learning_rate_power=-0.7, l2_regularization_strength=0.05,
        multiply_linear_by_learning_rate=True, clipvalue=1.0)),
    "ftrl_fixed_rate": ("FTRL", dict(
        learning_rate_power=0.0, l1_regularization_strength=0.003,
        beta=0.1)),
    "ftrl_zero_accumulator_allowed": ("FTRL", dict(
        allow_zero_accumulator=True, initial_accumulator_value=1e-3,
        weight_decay_factor=0.05, clip_weight_min=-0.2)),
}

# A power of the accumulator: glibc's powf in the kernels.
POWERS = {case for case, (name, kwargs) in CASES.items()
          if name == "AdagradMomentum" or
          kwargs.get("learning_rate_power", -0.5) != -0.5}

PATHS = {"fused": dict(fused_kernels=True, interleaved_slots=False),
         "interleaved": dict(fused_kernels=True, interleaved_slots=True),
         "tensorflow": dict(fused_kernels=False, interleaved_slots=False)}

MODES = ("eager", "function", "function_dynamic_lr")


@pytest.fixture(scope="module", autouse=True)
def kernels():
  if build.load() is None:
    message = "the fused kernels cannot be built here (no C++ compiler)"
    if os.environ.get("CI") == "true":  # CI's machines have one
      pytest.fail(message)
    pytest.skip(message)


def _data(dim, seed=0):
  """The initial table, and per step the ids and their gradients: normal
  values times 10^k, k uniform in [-6, 3)."""
  rng = np.random.default_rng(seed)
  init = (rng.normal(size=(VOCAB, dim)) * 0.3).astype(np.float32)
  steps = []
  for _ in range(STEPS):
    ids = rng.integers(0, VOCAB - UNTOUCHED, BATCH)
    scale = 10.0 ** rng.uniform(-6, 3, (BATCH, dim))
    steps.append((ids, (rng.normal(size=(BATCH, dim)) *
                        scale).astype(np.float32)))
  return init, steps


def _learning_rate(mode):
  if mode != "function_dynamic_lr":
    return LR
  rate = tf.Variable(LR)
  return lambda: rate.read_value()


def _step(embedding, mode):
  def step(ids, grads):
    embedding.enqueue({"f": ids}, training=True)
    embedding.dequeue()
    embedding.apply_gradients({"f": grads})
  return step if mode == "eager" else tf.function(step)


def _train(path, opt_name, kwargs, dim, mode):
  """The table and its slots after the steps, trained on `path`."""
  init, steps = _data(dim)
  with tfemb.options.use(**PATHS[path]):
    table = tfemb.TableConfig(VOCAB, dim, name="t",
                              initializer=tf.constant_initializer(init))
    optimizer = getattr(tfemb, opt_name)(
        learning_rate=_learning_rate(mode), **kwargs)
    embedding = tfemb.TPUEmbedding({"f": tfemb.FeatureConfig(table)},
                                   optimizer)
    step = _step(embedding, mode)
    for ids, grads in steps:
      step(tf.constant(ids, tf.int64), tf.constant(grads))
    return {n: v.numpy() for n, v in embedding.variables[table].items()}


def _differ(got, want):
  """The flat positions where two float32 arrays differ in any bit."""
  return np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))


def _assert_same_bits(got, want, where):
  assert set(got) == set(want), where
  for name in want:
    differ = _differ(got[name], want[name])
    assert not differ.size, (
        f"{where}, {name}: {differ.size} of {want[name].size} elements "
        f"differ, e.g. {got[name].flat[differ[0]]!r} vs "
        f"{want[name].flat[differ[0]]!r}")


def _assert_same_bits_but_powers(got, want, where):
  """Bit for bit but in the few elements a 1-ulp power reaches, which
  stay within a few ulps (docs/numerics.md, 'Precision')."""
  assert set(got) == set(want), where
  for name in want:
    differ = _differ(got[name], want[name])
    assert differ.size <= 0.01 * want[name].size, (where, name, differ.size)
    np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=0,
                               err_msg=f"{where}, {name}")


def _reference(opt_name, kwargs, dim):
  """The numpy oracle's table and slots after the same steps."""
  params = dict(kwargs, learning_rate=LR)
  clip = kwargs.get("clipvalue")
  if clip is not None:
    params["clip_gradient"] = (clip if isinstance(clip, tuple) else
                               (-clip, clip))
  kind = {"SGD": "sgd", "Adagrad": "adagrad",
          "AdagradMomentum": "adagrad_momentum", "Adam": "adam",
          "FTRL": "ftrl"}[opt_name]
  init, steps = _data(dim)
  table = reference.Table(init, kind, params)
  for ids, grads in steps:
    table.apply(reference.row_gradients(zip(ids, grads)), LR)
  return dict(table.slots, parameters=table.w)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("case", list(CASES))
def test_tensorflow_ops_give_the_kernels_bits(case, dim, mode):
  opt_name, kwargs = CASES[case]
  got = {path: _train(path, opt_name, kwargs, dim, mode) for path in PATHS}
  _assert_same_bits(got["interleaved"], got["fused"], "interleaved")
  if case in POWERS:
    _assert_same_bits_but_powers(got["tensorflow"], got["fused"],
                                 "tensorflow")
  else:
    _assert_same_bits(got["tensorflow"], got["fused"], "tensorflow")
  # Both paths right, not only equal: the numpy oracle of the docs (in
  # float64; float32's rounding leaves a momentum near 0 5e-4 away).
  want = _reference(opt_name, kwargs, dim)
  for name, value in want.items():
    np.testing.assert_allclose(got["tensorflow"][name], value, rtol=1e-3,
                               atol=1e-5, err_msg=name)


@pytest.mark.parametrize("exponent", [2.0, 3.0, 0.5])
def test_a_power_is_the_kernels_but_in_about_one_element_in_1600(exponent):
  """AdagradMomentum without momentum, lr 1 and gradients 1 leaves in its
  momenta `(a + 1 + epsilon)^(-1/exponent)` for each accumulator `a`: a
  power of each float32 value in eight decades, on each path."""
  rows, dim = 4000, 37
  rng = np.random.default_rng(int(exponent))
  accumulators = (10.0 ** rng.uniform(-4, 8, (rows, dim))).astype(np.float32)
  momenta = {}
  for path in ("fused", "tensorflow"):
    with tfemb.options.use(**PATHS[path]):
      table = tfemb.TableConfig(rows, dim, name="t")
      embedding = tfemb.TPUEmbedding(
          {"f": tfemb.FeatureConfig(table)},
          tfemb.AdagradMomentum(1.0, momentum=0.0, exponent=exponent))
      embedding.build()
      embedding.variables[table]["accumulators"].assign(accumulators)
      embedding.enqueue({"f": tf.range(rows, dtype=tf.int64)},
                        training=True)
      embedding.dequeue()
      embedding.apply_gradients({"f": tf.ones([rows, dim])})
      momenta[path] = embedding.variables[table]["momenta"].numpy()
  got, want = momenta["tensorflow"], momenta["fused"]
  differ = _differ(got, want)
  assert differ.size <= 0.002 * got.size, differ.size
  ulps = np.abs(got.view(np.int32).flat[differ].astype(np.int64) -
                want.view(np.int32).flat[differ])
  assert set(ulps) <= {1}, ulps.max()


@pytest.mark.requires_tensorflow("2.17", why="the SparseCore host engine")
@pytest.mark.parametrize("case", ["adagrad", "adam", "ftrl_beta"])
def test_the_sparsecore_engine_gives_the_kernels_bits_too(case):
  """`TPUEmbeddingV2` updates its stacked table with the same rules."""
  opt_name, kwargs = CASES[case]
  init, steps = _data(37)
  got = {}
  for path in ("fused", "tensorflow"):
    with tfemb.options.use(**PATHS[path]):
      table = tfemb.TableConfig(VOCAB, 37, name="t",
                                initializer=tf.constant_initializer(init))
      embedding = tfemb.TPUEmbeddingV2(
          {"f": tfemb.FeatureConfig(table, output_shape=[BATCH])},
          getattr(tfemb, opt_name)(learning_rate=LR, **kwargs))

      @tf.function
      def step(ids, grads):
        _, preserved = embedding({"f": ids})
        embedding.apply_gradients({"f": grads}, preserved)

      for ids, grads in steps:
        step(tf.constant(ids, tf.int64), tf.constant(grads))
      (stacked,) = embedding.variables.values()
      got[path] = {n: v.numpy() for n, v in stacked.items()}
  _assert_same_bits(got["tensorflow"], got["fused"], "tensorflow")
