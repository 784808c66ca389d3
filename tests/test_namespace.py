"""`import tfemb as embedding` replaces `tf.tpu.experimental.embedding`.

The names come from the installed TensorFlow's namespace itself, so a name a
future TensorFlow adds fails here until tfemb has it. tfemb's API is
TensorFlow 2.21's on every supported version: with an older TensorFlow,
tfemb has in addition exactly what `tfemb.tf_versions.ADDED_IN` says that
version lacks (classes, and arguments at the end of a signature).
"""

import inspect

import pytest
import tensorflow as tf

import tfemb
from tfemb import sparsecore_backports
from tfemb import tf_versions

tf_emb = tf.tpu.experimental.embedding
TF_NAMES = sorted(n for n in dir(tf_emb) if not n.startswith("_"))
# What 2.21 added since the installed TensorFlow (nothing on 2.21).
NEWER = tf_versions.missing_here()
# Plain data and initializer classes that tfemb takes from TensorFlow as
# they are where it has them with 2.21's arguments
# (`tfemb.sparsecore_configs`).
TENSORFLOWS_OWN = ("CustomCombiner", "CustomOptimizer", "RowIdInitializer",
                   "SparseCoreEmbeddingConfig")


def _parameters(obj, leave_out=()):
  """(name, kind, default) of each parameter of a function or a class, as
  `inspect.signature` (so `help()` and IDEs) reads it, but those named in
  `leave_out`; annotations are left out."""
  return [(p.name, p.kind, p.default)
          for p in inspect.signature(obj).parameters.values()
          if p.name not in leave_out]


def test_the_namespace_is_read_from_tensorflow():
  """The test below cannot pass vacuously: the names of every supported
  TensorFlow are all found, engines, configs, optimizers and functions
  alike; with 2.21, all 17."""
  assert {"TPUEmbedding", "TPUEmbeddingV2", "TableConfig", "SGD",
          "serving_embedding_lookup", "RowIdInitializer"} <= set(TF_NAMES)
  assert len(TF_NAMES) + len([n for n in NEWER if "." not in n]) == 17


@pytest.mark.parametrize("name", TF_NAMES)
def test_every_name_exists_with_tensorflows_signature(name):
  """With 2.21, the same signature; with an older TensorFlow, the same once
  the arguments 2.21 added since are left out of tfemb's. Read from the
  class itself: the engines' `__new__`, which hands off to TensorFlow under
  a TPUStrategy, shows their constructor's arguments."""
  theirs = getattr(tf_emb, name)
  assert hasattr(tfemb, name), f"tfemb has no {name}"
  assert name in tfemb.__all__
  ours = getattr(tfemb, name)
  assert inspect.isclass(ours) == inspect.isclass(theirs)
  added = [k.split(".")[1] for k in NEWER if k.startswith(f"{name}.")]
  assert _parameters(ours, added) == _parameters(theirs)
  if added:  # they come last, so a 2.21 call's positions are the same
    assert sorted(p[0] for p in _parameters(ours)[-len(added):]) == sorted(
        added)


@pytest.mark.parametrize("name", TENSORFLOWS_OWN)
def test_the_sparsecore_config_classes_are_tensorflows_own(name):
  """Where the installed TensorFlow has the class with 2.21's arguments;
  else tfemb's copy of 2.21's (`tfemb.sparsecore_backports`)."""
  assert name in tfemb.__all__
  if any(k == name or k.startswith(f"{name}.") for k in NEWER):
    assert getattr(tfemb, name) is getattr(sparsecore_backports, name)
  else:
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


def test_tfembs_copies_have_the_signatures_of_2_21():
  """`tfemb.sparsecore_backports` against the installed TensorFlow's classes
  where they are 2.21's (with 2.21: all three)."""
  compared, names = 0, ("CustomCombiner", "CustomOptimizer",
                        "SparseCoreEmbeddingConfig")
  for name in names:
    theirs = tf_versions.newest_class(name)
    if theirs is not None:
      assert (_parameters(getattr(sparsecore_backports, name)) ==
              _parameters(theirs)), name
      compared += 1
  # A class is older here if it, or one of its arguments, is newer.
  assert compared == 3 - len({n.split(".")[0] for n in NEWER} & set(names))
