"""One declaration per optimizer (`tfemb.optimizers.DECLARATIONS`).

Each declaration agrees with TensorFlow's class of the same optimizer (slot
names, constructor arguments, proto message and fields), is exported, has
its C++ row rule, and names its kernel constants so the generated rule
table can index them; `identify` finds it for tfemb's and TensorFlow's
classes (and their subclasses) and refuses anything else.
"""

import inspect
import re

import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2

import helpers
import tfemb
from tfemb import optimizers
from tfemb.kernels import rule_table

KERNELS = helpers.ROOT / "tfemb" / "kernels" / "src" / "update_rules.h"
DECLARATIONS = {d.name: d for d in optimizers.DECLARATIONS}


def test_the_five_optimizers_are_declared():
  assert list(DECLARATIONS) == ["SGD", "Adagrad", "AdagradMomentum", "Adam",
                                "FTRL"]


@pytest.mark.parametrize("name", DECLARATIONS)
def test_a_declaration_agrees_with_tensorflows_class(name):
  declaration = DECLARATIONS[name]
  theirs = declaration.tf_class()
  assert declaration.tf_class is getattr(tf.tpu.experimental.embedding, name)
  assert list(declaration.slots) == theirs._slot_names()  # pylint: disable=protected-access
  assert declaration.cls()._slot_names() == theirs._slot_names()  # pylint: disable=protected-access
  assert declaration.arguments == tuple(
      inspect.signature(declaration.tf_class.__init__).parameters)[1:]
  message = optimization_parameters_pb2.OptimizationParameters.DESCRIPTOR
  fields = message.fields_by_name[declaration.proto_message].message_type
  for field, source in declaration.proto_fields.items():
    assert field in fields.fields_by_name, field
    if not callable(source):
      assert hasattr(theirs, source) and hasattr(declaration.cls(), source)


@pytest.mark.parametrize("name", DECLARATIONS)
def test_a_declared_class_is_exported(name):
  cls = DECLARATIONS[name].cls
  assert getattr(tfemb, name) is cls and getattr(optimizers, name) is cls
  assert name in tfemb.__all__


@pytest.mark.parametrize("name", DECLARATIONS)
def test_a_declaration_has_its_cpp_row_rule_and_named_constants(name):
  declaration = DECLARATIONS[name]
  with open(KERNELS) as f:
    assert f"RuleRow<rules::{name}>(" in f.read()
  constants = list(declaration.kernel_constants(declaration.cls()))
  assert len(set(constants)) == len(constants)
  header = rule_table.header()
  for i, constant in enumerate(constants):
    assert re.fullmatch(r"[a-z][a-z0-9_]*", constant), constant
    assert re.search(rf"int k\w+ = {i};", header)
  assert f'kName = "{name}";' in header


@pytest.mark.parametrize("name", DECLARATIONS)
def test_identify_knows_tfembs_and_tensorflows_classes(name):
  declaration = DECLARATIONS[name]

  class Derived(declaration.tf_class):
    pass

  for opt in (declaration.cls(), declaration.tf_class(), Derived()):
    assert optimizers.identify(opt) is declaration
    assert optimizers.is_optimizer(opt)


def test_identify_names_the_supported_classes_for_anything_else():
  keras_sgd = tf.keras.optimizers.SGD()  # a different SGD
  for other in (keras_sgd, None, "sgd", object()):
    assert not optimizers.is_optimizer(other)
    with pytest.raises(ValueError, match="SGD, Adagrad, AdagradMomentum, "
                       "Adam, FTRL"):
      optimizers.identify(other)


def test_a_subclass_of_a_tfemb_optimizer_converts_to_tensorflows_class():

  class Tuned(tfemb.Adam):
    pass

  converted = tfemb.to_tensorflow(Tuned(0.1, beta_1=0.5))
  assert type(converted) is tf.tpu.experimental.embedding.Adam
  assert converted.beta_1 == 0.5 and converted.learning_rate == 0.1
