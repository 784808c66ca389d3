"""`import tfemb as embedding` replaces `tf.tpu.experimental.embedding`.

The names come from TensorFlow's namespace itself, so a name a future
TensorFlow adds fails here until tfemb has it.
"""

import inspect

import pytest
import tensorflow as tf

import tfemb

tf_emb = tf.tpu.experimental.embedding
TF_NAMES = sorted(n for n in dir(tf_emb) if not n.startswith("_"))
# Plain data and initializer classes that tfemb takes from TensorFlow as
# they are (`tfemb.sparsecore_configs`).
TENSORFLOWS_OWN = ("CustomCombiner", "CustomOptimizer", "RowIdInitializer",
                   "SparseCoreEmbeddingConfig")


def _parameters(obj):
  """(name, kind, default) of each parameter of a function or of a class's
  `__init__`; annotations are left out."""
  function = obj.__init__ if inspect.isclass(obj) else obj
  return [(p.name, p.kind, p.default)
          for p in inspect.signature(function).parameters.values()]


def test_the_namespace_is_read_from_tensorflow():
  """The test below cannot pass vacuously: TensorFlow 2.21's names are all
  found, engines, configs, optimizers and functions alike."""
  assert {"TPUEmbedding", "TPUEmbeddingV2", "TableConfig", "SGD",
          "serving_embedding_lookup", "RowIdInitializer"} <= set(TF_NAMES)
  assert len(TF_NAMES) >= 17


@pytest.mark.parametrize("name", TF_NAMES)
def test_every_name_exists_with_tensorflows_signature(name):
  theirs = getattr(tf_emb, name)
  assert hasattr(tfemb, name), f"tfemb has no {name}"
  assert name in tfemb.__all__
  ours = getattr(tfemb, name)
  assert inspect.isclass(ours) == inspect.isclass(theirs)
  assert _parameters(ours) == _parameters(theirs)


@pytest.mark.parametrize("name", TENSORFLOWS_OWN)
def test_the_sparsecore_config_classes_are_tensorflows_own(name):
  assert getattr(tfemb, name) is getattr(tf_emb, name)


def test_a_mismatch_is_seen():
  """The comparison sees a renamed, a re-kinded or a re-defaulted
  parameter."""

  def reference(a, b=1, *, c=None):
    del a, b, c

  def renamed(a, d=1, *, c=None):
    del a, d, c

  def rekinded(a, b=1, c=None):
    del a, b, c

  def redefaulted(a, b=2, *, c=None):
    del a, b, c

  for other in (renamed, rekinded, redefaulted):
    assert _parameters(other) != _parameters(reference)
