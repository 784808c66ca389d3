"""The config and optimizer classes mirror TensorFlow's, field for field.

tfemb's are TensorFlow 2.21's; with an older TensorFlow the comparison
leaves out what that version lacks (`tfemb.tf_versions.missing_here`).
"""

import inspect

import pytest
import tensorflow as tf

import helpers
import tfemb
from tfemb import tf_versions

tf_emb = tf.tpu.experimental.embedding
CLASSES = ["SGD", "Adagrad", "AdagradMomentum", "Adam", "FTRL", "TableConfig",
           "FeatureConfig", "QuantizationConfig"]


@pytest.mark.parametrize("name", CLASSES)
def test_signature_matches_tensorflow(name):
  ours = inspect.signature(getattr(tfemb, name).__init__).parameters
  theirs = inspect.signature(getattr(tf_emb, name).__init__).parameters
  missing = [k.split(".")[1] for k in tf_versions.missing_here()
             if k.startswith(f"{name}.")]
  assert [p for p in ours if p not in missing] == list(theirs)
  for p in theirs:
    assert ours[p].kind == theirs[p].kind, p
    assert ours[p].default == theirs[p].default, p


@pytest.mark.parametrize("name", helpers.OPTIMIZER_CLASSES)
def test_defaults_match_tensorflow(name):
  ours, theirs = getattr(tfemb, name)(), getattr(tf_emb, name)()
  assert vars(ours) == vars(theirs)


BAD_ARGS = [
    ("SGD", dict(use_gradient_accumulation=False, clipvalue=1.0)),
    ("Adagrad", dict(initial_accumulator_value=0.0)),
    ("Adagrad", dict(slot_variable_creation_fn=3)),
    ("AdagradMomentum", dict(epsilon=0.0)),
    ("AdagradMomentum", dict(exponent=-1)),
    ("Adam", dict(beta_1=1.0)),
    ("Adam", dict(beta_2=-0.1)),
    ("Adam", dict(epsilon=0.0)),
    ("Adam", dict(lazy_adam=False, use_gradient_accumulation=False)),
    ("FTRL", dict(initial_accumulator_value=-1.0)),
    ("TableConfig", dict(vocabulary_size=0, dim=2)),
    ("TableConfig", dict(vocabulary_size=2.5, dim=2)),
    ("TableConfig", dict(vocabulary_size=5, dim=0)),
    ("TableConfig", dict(vocabulary_size=5, dim=2, initializer=3)),
    ("TableConfig", dict(vocabulary_size=5, dim=2, combiner="max")),
    ("TableConfig", dict(vocabulary_size=5, dim=2, dtype=tf.int64)),
    ("QuantizationConfig", dict(num_buckets=1, lower=0, upper=1)),
]


@pytest.mark.parametrize("name,kwargs", BAD_ARGS)
def test_validation_raises_like_tensorflow(name, kwargs):
  if any(f"{name}.{k}" in tf_versions.missing_here() for k in kwargs):
    # This TensorFlow has no such argument: 2.21 raises a ValueError.
    with pytest.raises(ValueError):
      getattr(tfemb, name)(**kwargs)
    return
  with pytest.raises(Exception) as theirs:
    getattr(tf_emb, name)(**kwargs)
  with pytest.raises(type(theirs.value)):
    getattr(tfemb, name)(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(table="not a table"),
    dict(table=None),
    dict(max_sequence_length=-1),
    dict(max_sequence_length=1.5),
    dict(validate_weights_and_indices="yes"),
])
def test_feature_config_validation(kwargs):
  args = dict(table=tfemb.TableConfig(5, 2, name="t"))
  args.update(kwargs)
  with pytest.raises(ValueError):
    tfemb.FeatureConfig(**args)


def test_clipvalue_forms():
  assert tfemb.SGD(clipvalue=2.0).clip_gradient_min == -2.0
  assert tfemb.SGD(clipvalue=2.0).clip_gradient_max == 2.0
  opt = tfemb.Adam(clipvalue=(None, 0.5))
  assert (opt.clip_gradient_min, opt.clip_gradient_max) == (None, 0.5)


def test_equality_hash_and_repr():
  a = tfemb.Adagrad(0.1, clipvalue=1.0)
  assert a == tfemb.Adagrad(0.1, clipvalue=1.0)
  assert a != tfemb.Adagrad(0.2, clipvalue=1.0)
  assert a != tfemb.SGD(0.1)
  assert hash(a) == hash(tfemb.Adagrad(0.1, clipvalue=1.0))
  assert len({a, tfemb.Adagrad(0.1, clipvalue=1.0), tfemb.Adam()}) == 2
  assert repr(a).startswith("Adagrad(learning_rate=0.1, "
                            "initial_accumulator_value=0.1")
  assert "clipvalue=(-1.0, 1.0)" in repr(a)
  # The repr is an expression that builds an equal object.
  assert eval(repr(tfemb.FTRL(0.3, beta=0.2)), vars(tfemb)) == tfemb.FTRL(
      0.3, beta=0.2)
  table = tfemb.TableConfig(10, 4, name="t", optimizer=tfemb.SGD(0.5))
  assert repr(table) == (
      "TableConfig(vocabulary_size=10, dim=4, initializer=None, "
      "optimizer=SGD(learning_rate=0.5, use_gradient_accumulation=True, "
      "clip_weight_min=None, clip_weight_max=None, weight_decay_factor=None, "
      "multiply_weight_decay_factor_by_learning_rate=None, clipvalue=None, "
      "low_dimensional_packing_status=False), combiner='mean', name='t', "
      "quantization_config=None)")
  feature = tfemb.FeatureConfig(table, max_sequence_length=3, name="f")
  assert repr(feature).startswith("FeatureConfig(table=TableConfig(")
  assert "max_sequence_length=3" in repr(feature)


def test_callable_learning_rate_is_kept():
  lr = tf.Variable(0.5)
  fn = lambda: lr * 2  # pylint: disable=unnecessary-lambda-assignment
  assert tfemb.Adam(fn).learning_rate is fn


OPTIMIZER_CASES = [
    tfemb.SGD(0.2, clip_weight_min=-1.0, clip_weight_max=2.0,
              weight_decay_factor=0.1,
              multiply_weight_decay_factor_by_learning_rate=True,
              clipvalue=(-0.5, None), low_dimensional_packing_status=True),
    tfemb.Adagrad(0.3, initial_accumulator_value=0.5, clipvalue=3.0,
                  use_gradient_accumulation=True, weight_decay_factor=0.01),
    tfemb.AdagradMomentum(0.1, momentum=0.9, use_nesterov=True, exponent=3.0,
                          beta2=0.99, epsilon=1e-5, clip_weight_max=4.0),
    tfemb.Adam(0.01, beta_1=0.8, beta_2=0.95, epsilon=1e-4, lazy_adam=False,
               sum_inside_sqrt=False, clipvalue=(None, 1.0)),
    tfemb.Adam(0.01, use_gradient_accumulation=False),
    tfemb.FTRL(0.05, learning_rate_power=-0.3, l1_regularization_strength=0.1,
               l2_regularization_strength=0.2, beta=0.5,
               initial_accumulator_value=0.4,
               multiply_linear_by_learning_rate=True,
               allow_zero_accumulator=True),
]


@pytest.mark.parametrize("opt", OPTIMIZER_CASES, ids=repr)
def test_optimizer_converts_to_tensorflow_field_by_field(opt):
  converted = tfemb.to_tensorflow(opt)
  assert type(converted) is getattr(tf_emb, type(opt).__name__)
  assert vars(converted) == vars(opt)


def test_feature_config_converts_and_keeps_tables_shared():
  init = tf.constant_initializer(0.5)
  shared = tfemb.TableConfig(100, 8, initializer=init, optimizer=tfemb.SGD(),
                             combiner="sqrtn", name="shared",
                             quantization_config=tfemb.QuantizationConfig(
                                 10, -1.0, 1.0))
  other = tfemb.TableConfig(7, 2, combiner="sum", name="other")
  config = {
      "a": tfemb.FeatureConfig(shared, name="a"),
      "b": [tfemb.FeatureConfig(shared, max_sequence_length=4,
                                validate_weights_and_indices=False),
            tfemb.FeatureConfig(other, output_shape=[2, 3])],
  }
  converted = tfemb.to_tensorflow(config)
  a, (b, c) = converted["a"], converted["b"]
  assert all(isinstance(f, tf_emb.FeatureConfig) for f in (a, b, c))
  assert a.table is b.table and a.table is not c.table
  table = a.table
  assert isinstance(table, tf_emb.TableConfig)
  assert (table.vocabulary_size, table.dim, table.combiner, table.name) == (
      100, 8, "sqrtn", "shared")
  assert table.initializer is init
  assert isinstance(table.optimizer, tf_emb.SGD)
  assert vars(table.optimizer) == vars(shared.optimizer)
  q = table.quantization_config
  assert (type(q), q.num_buckets, q.lower, q.upper) == (
      tf_emb.QuantizationConfig, 10, -1.0, 1.0)
  # Before 2.20, TensorFlow's TableConfig has no dtype (float32 throughout).
  assert getattr(table, "dtype", tf.float32) == tf.float32
  assert table.layout is None
  assert (b.max_sequence_length, b.validate_weights_and_indices) == (4, False)
  assert c.output_shape == tf.TensorShape([2, 3])
  assert a.name == "a" and c.table.combiner == "sum"
  assert isinstance(c.table.initializer, type(other.initializer))


def test_tensorflow_objects_pass_through():
  feature = tf_emb.FeatureConfig(tf_emb.TableConfig(5, 2, name="t"))
  assert tfemb.to_tensorflow(feature) is feature
