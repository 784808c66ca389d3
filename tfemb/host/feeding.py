"""From the user's features (and weights) to one `inputs.Lookup` per input.

A training batch holds every configured feature, in the structure of
`feature_config`; a direct lookup (`TPUEmbeddingForServing`'s rules) may
hold any subset of them, matched by path.
"""

from typing import Any, List, Optional, Sequence, Tuple, Union

from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import input_dtypes
from tfemb import inputs
from tfemb import resolution


def check_structure(config: resolution.Resolved, value, what="features"):
  try:
    nest.assert_same_structure(config.structure, value)
  except (ValueError, TypeError) as e:
    raise type(e)(f"{what} must have the structure of feature_config "
                  f"({config.paths}): {e}") from None


def match_subset(config: resolution.Resolved, features) -> List[int]:
  """For direct lookups: the inputs' paths must be features' paths."""
  index = {path: i for i, path in enumerate(config.paths)}
  paths = [p for p, _ in nest.flatten_with_joined_string_paths(features)]
  unknown = [p for p in paths if p not in index]
  if unknown:
    raise ValueError(
        f"Inputs are not a subset of feature_config. Unknown feature(s) "
        f"{unknown}; feature_config has {config.paths}.")
  return [index[p] for p in paths]


def flat_inputs(config: resolution.Resolved, features, weights,
                serving: bool) -> Tuple[List[int], List[Any], List[Any]]:
  """Checks the structures; the feature indices, inputs and weights."""
  if serving:
    feature_ids = match_subset(config, features)
  else:
    check_structure(config, features)
    feature_ids = list(range(len(config.features)))
  flat = nest.flatten(features)
  flat_weights = [None] * len(flat)
  if weights is not None:
    try:
      nest.assert_same_structure(features, weights)
    except (ValueError, TypeError) as e:
      raise type(e)("weights must have the structure of the features, "
                    f"with None where a feature has no weights: {e}"
                   ) from None
    flat_weights = nest.flatten(weights)
  return feature_ids, [inputs.as_input(x) for x in flat], flat_weights


def lookups(config: resolution.Resolved, feature_ids: Sequence[int],
            flat: Sequence[Any], flat_weights: Sequence[Any],
            dtypes: input_dtypes.InputDtypes,
            serving: Union[bool, Sequence[bool]],
            fixed_shapes: Optional[Sequence[Any]] = None,
            global_part: bool = False) -> List[Any]:
  """One Lookup per input (`dtypes`: the engine's casts or refusals;
  `serving`: the serving class's shape rules, for all inputs or per input;
  `fixed_shapes`: the TPU protocol's activation shapes, per feature;
  `global_part`: `inputs.to_lookup`'s)."""
  if isinstance(serving, bool):
    serving = [serving] * len(flat)
  return [
      inputs.to_lookup(config.paths[i], x, w, config.features[i], dtypes,
                       serving=s,
                       fixed_shape=None if fixed_shapes is None else
                       fixed_shapes[i], global_part=global_part)
      for i, x, w, s in zip(feature_ids, flat, flat_weights, serving)]
