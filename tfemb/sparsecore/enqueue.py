"""A batch's lookups, as `TPUEmbeddingV2.enqueue` prepares them.

Each input follows TensorFlow 2.21's `TPUEmbeddingV2` input rules
(`tfemb.sparsecore.input_rules`); a feature whose table has a `CustomCombiner`
keeps the ids its combiner sees (`tfemb.sparsecore.combiner`); the others
are looked up as the host engine looks them up (`tfemb.host.feeding`),
then held to the SparseCore's limits per chip where a
`SparseCoreEmbeddingConfig` sets them (`tfemb.sparsecore.limit_enforcement`).
"""

from typing import Any, Dict, List, Optional, Tuple

from tensorflow.python.util import nest  # pylint: disable=g-direct-tensorflow-import

from tfemb import input_dtypes
from tfemb import resolution
from tfemb.host import feeding
from tfemb.sparsecore import combiner as combiner_lib
from tfemb.sparsecore import input_rules
from tfemb.sparsecore import limit_enforcement


def lookups(config: resolution.Resolved, features: Any, weights: Any,
            output_shapes, combiners: combiner_lib.CustomCombiners,
            id_limits: Optional[limit_enforcement.IdLimits],
            global_part: bool = False
           ) -> Tuple[List[int], List[Any], Dict[int, combiner_lib.Kept]]:
  """`(feature ids, their lookups, {custom feature: its kept ids})` of a
  batch of any subset of the configured features. `global_part`: a
  replica's part of the global batch (`inputs.to_lookup`'s), where no
  limit is held."""
  feature_ids, _, flat_weights = feeding.flat_inputs(
      config, features, weights, False)
  regular = [i for i in feature_ids if i not in combiners.features]
  global_part = global_part and id_limits is None
  flat, flat_weights = zip(*(
      input_rules.prepare(path, feature, x, w,
                          cast_ids=not (global_part and i in regular))
      for i, (path, feature, x, w) in enumerate(zip(
          config.paths, config.features, nest.flatten(features),
          flat_weights))))
  by_feature = dict(zip(regular, feeding.lookups(
      config, regular, [flat[i] for i in regular],
      [flat_weights[i] for i in regular], input_dtypes.V2, False,
      output_shapes, global_part)))
  combined, kept = combiners.lookup(flat, flat_weights, output_shapes)
  by_feature.update(combined)
  if id_limits is not None:
    by_feature.update(zip(regular, id_limits.apply(
        regular, [by_feature[i] for i in regular])))
  return feature_ids, [by_feature[i] for i in feature_ids], kept
