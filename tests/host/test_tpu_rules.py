"""If it passes on CPU, it runs on TPU: the host engine refuses, by
default, what TensorFlow's TPU engine refuses, with the same kind of error
and message, at build or at the first call. One test per rule."""

import numpy as np
import pytest
import tensorflow as tf

import helpers
import tfemb


def embedding(feature_kwargs=None, optimizer=None):
  table = tfemb.TableConfig(10, 2, name="t")
  feature = tfemb.FeatureConfig(table, **(feature_kwargs or {}))
  return tfemb.TPUEmbedding({"f": feature}, optimizer or tfemb.SGD(0.1))


def enqueue(features, weights=None, feature_kwargs=None):
  emb = embedding(feature_kwargs)
  emb.enqueue({"f": features}, None if weights is None else {"f": weights})
  return emb


INPUT_RULES = [
    ("dense ids need rank >= 1", lambda: enqueue(tf.constant(1)),
     ValueError, "Only rank 1 and above dense tensor"),
    ("dense ids of rank >= 2 end in a dimension of 1",
     lambda: enqueue(tf.constant([[1, 2]])), ValueError,
     "should have last dimension as 1"),
    ("sparse ids need rank >= 2",
     lambda: enqueue(tf.sparse.from_dense(tf.constant([1, 2]))), ValueError,
     "Only rank 2 and above sparse tensor"),
    ("ragged ids are rank 2",
     lambda: enqueue(tf.ragged.constant([[[1]]])), ValueError,
     "Only rank 2 ragged tensor"),
    ("no weights for dense ids",
     lambda: enqueue(tf.constant([1]), tf.constant([1.0])), ValueError,
     "Weight specified for dense input f, which is not allowed"),
    ("weights of the ids' kind",
     lambda: enqueue(helpers.ragged([[1]]),
                     helpers.sparse([[1]], [[1.0]], tf.float32)),
     ValueError, "which does not match type input which is RaggedTensor."),
    ("sparse weights for sparse ids",
     lambda: enqueue(helpers.sparse([[1]]), helpers.ragged([[1.0]],
                                                           tf.float32)),
     ValueError, "which does not match type input which is SparseTensor."),
    ("a ragged batch matches a one-dimensional output_shape",
     lambda: enqueue(helpers.ragged([[1], [2], [3]]),
                     feature_kwargs=dict(output_shape=[4])),
     ValueError, "Inconsistent shape founded for input feature f"),
    ("dense ids match the output_shape",
     lambda: enqueue(tf.constant([1, 2, 3]),
                     feature_kwargs=dict(output_shape=[4])),
     ValueError, "Inconsistent shape founded for input feature f"),
    ("a sequence feature takes sparse or ragged ids",
     lambda: enqueue(tf.constant([1, 2]),
                     feature_kwargs=dict(max_sequence_length=2)),
     ValueError, "sequence feature but a dense tensor"),
]

CONFIG_RULES = [
    ("table names are unique", lambda: tfemb.TPUEmbedding(
        {"a": tfemb.FeatureConfig(tfemb.TableConfig(3, 2, name="x")),
         "b": tfemb.FeatureConfig(tfemb.TableConfig(4, 2, name="x"))},
        tfemb.SGD()), ValueError, "Tables must have a unique name"),
    ("only embedding optimizers", lambda: embedding(
        optimizer=tf.keras.optimizers.SGD()), ValueError,
     "unsupported optimizer class"),
    ("gradient clipping needs gradient accumulation",
     lambda: tfemb.Adagrad(use_gradient_accumulation=False, clipvalue=1.0),
     ValueError, "gradient clipping cannot be used"),
    ("non-lazy Adam needs gradient accumulation",
     lambda: tfemb.Adam(lazy_adam=False, use_gradient_accumulation=False),
     ValueError, "gradient accumulation must be used"),
]


@pytest.mark.parametrize("rule,make,error,message",
                         INPUT_RULES + CONFIG_RULES,
                         ids=[r[0] for r in INPUT_RULES + CONFIG_RULES])
def test_rule(rule, make, error, message):
  del rule
  with pytest.raises(error, match=message):
    make()


def test_shapes_do_not_change_between_enqueues():
  emb = enqueue(tf.constant([1, 2]))
  with pytest.raises(ValueError, match="Inconsistent shape founded for input "
                     "feature f"):
    emb.enqueue({"f": tf.constant([1, 2, 3])})


def test_enqueue_needs_fully_defined_shapes():
  emb = embedding()

  @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
  def step(ids):
    emb.enqueue({"f": ids}, training=False)
    return emb.dequeue()

  with pytest.raises(ValueError, match="not fully defined"):
    step(tf.constant([1, 2], tf.int64))


def test_dequeue_and_apply_gradients_need_a_built_object():
  emb = embedding()
  with pytest.raises(RuntimeError, match="dequeue called on unbuilt"):
    emb.dequeue()
  with pytest.raises(RuntimeError, match="apply_gradients called on unbuilt"):
    emb.apply_gradients({"f": tf.zeros([1, 2])})


def test_gradients_have_the_activation_shape():
  emb = enqueue(tf.constant([1, 2]))
  emb.dequeue()
  with pytest.raises(ValueError, match="Found gradient of shape"):
    emb.apply_gradients({"f": tf.zeros([3, 2])})


def test_build_input_shapes_match_the_feature_structure():
  emb = embedding()
  with pytest.raises((ValueError, TypeError)):
    emb.build(per_replica_input_shapes=[tf.TensorShape([2]),
                                        tf.TensorShape([2])])


def test_build_refuses_shapes_that_are_not_fully_defined():
  emb = embedding()
  with pytest.raises(ValueError, match="Input Feature f has output shape"):
    emb.build([tf.TensorShape([1, None, None])])
  # A shape fixed before (here as a FeatureConfig's would be) wins over a
  # partial one given to build.
  emb = embedding()
  emb._output_shapes = [tf.TensorShape([2, 4])]  # pylint: disable=protected-access
  emb.build([tf.TensorShape([2, None, None])])
  assert emb._output_shapes == [tf.TensorShape([2, 4])]  # pylint: disable=protected-access


@pytest.mark.parametrize("gradients,error", [((1,), ValueError),
                                             ([1], TypeError)])
def test_bad_gradients_are_named_before_the_missing_batch(gradients, error):
  """As TensorFlow's invalid-input test: a non-tensor gradient (or one of
  another structure) is reported as such, even before any dequeue."""
  table = tfemb.TableConfig(10, 2, name="t")
  emb = tfemb.TPUEmbedding((tfemb.FeatureConfig(table),), tfemb.SGD(0.1))
  emb.build(2)
  message = ("found non-tensor type" if error is ValueError else
             "same nested structure")
  with pytest.raises(error, match=message):
    tf.function(lambda: emb.apply_gradients(gradients))()
  with pytest.raises(error, match=message):
    emb.apply_gradients(gradients)


def test_a_numpy_gradient_is_not_a_tensor():
  emb = enqueue(tf.constant([1, 2]))
  emb.dequeue()
  with pytest.raises(ValueError, match="found non-tensor type"):
    emb.apply_gradients({"f": np.zeros([2, 2], np.float32)})
