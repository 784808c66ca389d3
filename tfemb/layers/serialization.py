"""Configs to and from plain Python (JSON) values, for Keras `get_config`.

A feature config structure becomes `{"structure", "features", "tables"}`:
the nesting with each `FeatureConfig` replaced by its index, the features,
and the tables they share (by index). Initializers are saved when they are
TensorFlow's or Keras' own; optimizers by class and constructor arguments;
a `KerasLearningRate` with its schedule. What cannot be written (a lambda
initializer or learning rate, a slot variable creation function) raises a
ValueError naming the table.
"""

from typing import Any, Dict

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import init_ops_v2  # pylint: disable=g-direct-tensorflow-import

from tfemb import configs
from tfemb import optimizers
from tfemb.layers import keras_optimizers


def _jsonable(value):
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, (np.floating, np.integer)):
    return value.item()
  if isinstance(value, dict):
    return {k: _jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_jsonable(v) for v in value]
  return value


def initializer_to_config(init, table_name):
  if type(init).__module__ == init_ops_v2.__name__:
    return {"tf": type(init).__name__, "config": _jsonable(init.get_config())}
  if type(init).__module__.startswith(("keras.", "tf_keras.")):
    return {"keras": tf.keras.initializers.serialize(init)}
  raise ValueError(
      f"Table {table_name!r}: its initializer {init!r} cannot be saved in a "
      "Keras config; use a TensorFlow (tf.*_initializer) or Keras initializer.")


def initializer_from_config(config):
  if "tf" in config:
    return getattr(init_ops_v2, config["tf"]).from_config(config["config"])
  return tf.keras.initializers.deserialize(config["keras"])


def _learning_rate_to_config(lr, table_name):
  if isinstance(lr, keras_optimizers.KerasLearningRate):
    base = lr.base
    if callable(base) and hasattr(base, "get_config"):
      base = {"schedule": tf.keras.optimizers.schedules.serialize(base)}
    elif callable(base):
      base = None
    if base is not None:
      return {"keras_learning_rate": {
          "base": base, "decay": lr.decay,
          "adam_betas": None if lr.adam_betas is None else list(
              lr.adam_betas)}}
  elif not callable(lr):
    return float(lr)
  raise ValueError(
      f"Table {table_name!r}: a callable learning rate cannot be saved in a "
      "Keras config; use a float or a Keras LearningRateSchedule.")


def _learning_rate_from_config(config):
  if not isinstance(config, dict):
    return config
  config = config["keras_learning_rate"]
  base = config["base"]
  if isinstance(base, dict):
    base = tf.keras.optimizers.schedules.deserialize(base["schedule"])
  betas = config["adam_betas"]
  return keras_optimizers.KerasLearningRate(
      base, decay=config["decay"], adam_betas=None if betas is None else
      tuple(betas))


def optimizer_to_config(opt, table_name):
  if opt is None:
    return None
  declaration = optimizers.identify(opt)
  if getattr(opt, "slot_variable_creation_fn", None) is not None:
    raise ValueError(f"Table {table_name!r}: an optimizer with a "
                     "slot_variable_creation_fn cannot be saved in a config.")
  args = {}
  for arg in declaration.arguments:
    if arg == "clipvalue":
      lo, hi = opt.clip_gradient_min, opt.clip_gradient_max
      args[arg] = None if lo is None and hi is None else [lo, hi]
    elif arg != "slot_variable_creation_fn":
      args[arg] = getattr(opt, arg)
  args["learning_rate"] = _learning_rate_to_config(opt.learning_rate,
                                                   table_name)
  return {"class_name": declaration.name, "config": args}


def optimizer_from_config(config):
  if config is None:
    return None
  args = dict(config["config"])
  args["learning_rate"] = _learning_rate_from_config(args["learning_rate"])
  if args.get("clipvalue") is not None:
    args["clipvalue"] = tuple(args["clipvalue"])
  declaration = next(
      (d for d in optimizers.DECLARATIONS if d.name == config["class_name"]),
      None)
  if declaration is None:
    raise ValueError(
        f"Unknown optimizer {config['class_name']!r} in a layer config; "
        f"expected one of {[d.name for d in optimizers.DECLARATIONS]}.")
  return declaration.cls(**args)


def feature_config_to_config(feature_config,
                             global_optimizer=None) -> Dict[str, Any]:
  """`global_optimizer`: the layer's own; a table trained by it is saved
  without one, so it shares the layer's again when loaded."""
  tables, features = [], []
  for feature in tf.nest.flatten(feature_config):
    if not any(feature.table is t for t in tables):
      tables.append(feature.table)
    features.append({
        "table": next(i for i, t in enumerate(tables) if t is feature.table),
        "max_sequence_length": feature.max_sequence_length,
        "validate_weights_and_indices": feature.validate_weights_and_indices,
        "output_shape": (None if feature.output_shape.rank is None else
                         feature.output_shape.as_list()),
        "name": feature.name,
    })
  counter = iter(range(len(features)))
  structure = tf.nest.map_structure(lambda _: next(counter), feature_config)
  table_configs = []
  for t in tables:
    q = t.quantization_config
    table_configs.append({
        "vocabulary_size": t.vocabulary_size, "dim": t.dim,
        "initializer": initializer_to_config(t.initializer, t.name),
        "optimizer": (None if t.optimizer is global_optimizer else
                      optimizer_to_config(t.optimizer, t.name)),
        "combiner": t.combiner, "name": t.name,
        "quantization_config": None if q is None else {
            "num_buckets": q.num_buckets, "lower": q.lower, "upper": q.upper},
    })
  return {"structure": structure, "features": features,
          "tables": table_configs}


def feature_config_from_config(config):
  tables = []
  for t in config["tables"]:
    t = dict(t)
    t["initializer"] = initializer_from_config(t["initializer"])
    t["optimizer"] = optimizer_from_config(t["optimizer"])
    if t["quantization_config"] is not None:
      t["quantization_config"] = configs.QuantizationConfig(
          **t["quantization_config"])
    tables.append(configs.TableConfig(**t))
  features = []
  for f in config["features"]:
    f = dict(f)
    f["table"] = tables[f["table"]]
    features.append(configs.FeatureConfig(**f))
  return tf.nest.map_structure(lambda i: features[i], config["structure"])
