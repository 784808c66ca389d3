"""The SparseCore generation's configs in tfemb's configs: a `CustomCombiner`
as a table's combiner, a `CustomOptimizer` as a table's or the global
optimizer, `layout` and `dtype`; accepted, resolved and converted as
TensorFlow's configs take them, and refused with TensorFlow's errors."""

import pytest
import tensorflow as tf

import helpers
import tfemb
from tfemb import optimizers
from tfemb import resolution

tf_emb = tf.tpu.experimental.embedding


def sum_combiner(valency, vectors):
  mask = tf.range(vectors.shape[0]) < valency
  return tf.reduce_sum(tf.where(mask[:, None], vectors, 0.0), axis=0)


def custom_optimizer(**kwargs):
  return tfemb.CustomOptimizer(
      helpers.sgd_computation, learning_rate=0.1, slot_names=["velocity"],
      slot_initializers=[tf.zeros_initializer()], **kwargs)


@pytest.mark.parametrize("module", [
    pytest.param(tfemb, id="tfemb"),
    pytest.param(tf_emb, id="tf",
                 marks=pytest.mark.requires_tensorflow("2.20")),
])
def test_table_config_takes_a_custom_combiner_layout_and_dtype(module):
  combiner = tfemb.CustomCombiner(sum_combiner, max_valency=4)
  layout = object()
  table = module.TableConfig(10, 4, combiner=combiner, name="t",
                             layout=layout, dtype=tf.int32)
  assert table.combiner is combiner
  assert table.layout is layout and table.dtype == tf.int32
  assert tfemb.FeatureConfig(table).table is table


@pytest.mark.requires_tensorflow("2.20")  # TensorFlow's CustomCombiner
@pytest.mark.parametrize("combiner", [3, None, tfemb.SGD(), sum_combiner,
                                      b"mean"], ids=repr)
def test_other_combiners_are_refused_with_tensorflows_message(combiner):
  with pytest.raises(ValueError) as theirs:
    tf_emb.TableConfig(10, 4, combiner=combiner, name="t")
  with pytest.raises(ValueError) as ours:
    tfemb.TableConfig(10, 4, combiner=combiner, name="t")
  assert str(ours.value) == str(theirs.value)


@pytest.mark.requires_tensorflow("2.20")  # TensorFlow's CustomCombiner
def test_to_tensorflow_passes_custom_combiners_and_optimizers_through():
  combiner = tfemb.CustomCombiner(sum_combiner, max_valency=4)
  own, global_opt = custom_optimizer(), custom_optimizer()
  table = tfemb.TableConfig(10, 4, combiner=combiner, optimizer=own,
                            name="t")
  config = (tfemb.FeatureConfig(table), tfemb.FeatureConfig(table))
  converted, converted_opt = tfemb.to_tensorflow((config, global_opt))

  def passed(converted, given):
    if tfemb.CustomOptimizer is tf_emb.CustomOptimizer:
      return converted is given  # TensorFlow's own class: as it is
    # 2.18 to 2.20: tfemb's copy of 2.21's becomes TensorFlow's.
    return (type(converted) is tf_emb.CustomOptimizer and
            converted.custom_computation is given.custom_computation and
            converted._slot_names() == given._slot_names())  # pylint: disable=protected-access

  assert passed(converted_opt, global_opt)
  assert converted[0].table is converted[1].table
  assert isinstance(converted[0].table, tf_emb.TableConfig)
  assert converted[0].table.combiner is combiner
  assert passed(converted[0].table.optimizer, own)
  assert passed(tfemb.to_tensorflow(own), own)


def test_is_custom_knows_custom_optimizers_only():

  class Derived(tfemb.CustomOptimizer):
    pass

  for custom in (custom_optimizer(), Derived(helpers.sgd_computation)):
    assert optimizers.is_custom(custom)
    assert not optimizers.is_optimizer(custom)
    # No declaration: the five declared optimizers only.
    with pytest.raises(ValueError, match="SGD, Adagrad, AdagradMomentum, "
                       "Adam, FTRL"):
      optimizers.identify(custom)
  for other in (tfemb.SGD(), tf_emb.Adam(), tf.keras.optimizers.SGD(), None,
                tfemb.CustomCombiner(sum_combiner, max_valency=2)):
    assert not optimizers.is_custom(other)


def test_resolve_takes_custom_optimizers_as_global_and_per_table():
  own, global_opt = custom_optimizer(), custom_optimizer()
  with_own = tfemb.TableConfig(10, 4, optimizer=own, name="own")
  declared = tfemb.TableConfig(10, 4, optimizer=tfemb.SGD(0.5), name="sgd")
  plain = tfemb.TableConfig(10, 4, name="plain")
  config = {"a": tfemb.FeatureConfig(with_own),
            "b": tfemb.FeatureConfig(declared),
            "c": tfemb.FeatureConfig(plain)}
  resolved = resolution.resolve(config, global_opt)
  assert [t.name for t in resolved.tables] == ["own", "sgd", "plain"]
  assert resolved.table_of(with_own).optimizer is own
  assert resolved.table_of(declared).optimizer is declared.optimizer
  assert resolved.table_of(plain).optimizer is global_opt
  assert plain.optimizer is None  # the user's config is not changed


def test_resolve_still_refuses_what_is_no_embedding_optimizer():
  config = {"a": tfemb.FeatureConfig(tfemb.TableConfig(10, 4, name="t"))}
  with pytest.raises(ValueError, match="unsupported optimizer class"):
    resolution.resolve(config, tf.keras.optimizers.SGD())
