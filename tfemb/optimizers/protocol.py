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
