"""The methods through which TensorFlow's TPU embedding engines read an
embedding optimizer's slots and arguments.

TensorFlow's optimizer classes (and `CustomOptimizer`, `CustomCombiner`)
name their slots and give their initializers through `_slot_names()` and
`_slot_initializers()`, and their constructor's arguments through
`_constructor_args()`; tfemb's classes mirror them, so an optimizer of
either kind works wherever a table's optimizer is read. These functions are
the one place tfemb calls them.
"""

from typing import Any, Callable, Dict, List

from tfemb.optimizers import parameters

# pylint: disable=protected-access


def slot_names(optimizer: Any) -> List[str]:
  """The optimizer's slot names, in TensorFlow's order; [] for None."""
  return list(optimizer._slot_names()) if optimizer is not None else []


def slot_initializers(optimizer: Any) -> List[Callable[..., Any]]:
  """The initializers of the optimizer's (or a `CustomCombiner`'s) slots,
  in the order of `slot_names`; [] for None."""
  return list(optimizer._slot_initializers()) if optimizer is not None else []


def constructor_args(optimizer: Any) -> Dict[str, Any]:
  """The arguments that construct the same optimizer."""
  return dict(optimizer._constructor_args())


def slot_dims(optimizer: Any) -> List[int]:
  """The rank of each of the optimizer's slots, in the order of
  `slot_names`: 2 (as wide as the table), or 1 for a `CustomOptimizer`'s
  slot of `slot_dims` 1 (one value per row); [] for None. A declared
  optimizer's slots (tfemb's classes or TensorFlow's) are all 2-D; a
  `CustomOptimizer` says it in `slot_dims`, which TensorFlow's before 2.21
  lacks (all 2-D there)."""
  names = slot_names(optimizer)
  dims = []
  if optimizer is not None and parameters.declared(optimizer) is None:
    # A CustomOptimizer: TensorFlow's class, or tfemb's copy of 2.21's.
    dims = list(getattr(optimizer, "slot_dims", ()) or ())
  return dims + [2] * (len(names) - len(dims))
