"""`ByTableConfig`: a dict keyed by the resolved `TableConfig`s, as
TensorFlow's engines key their `embedding_tables` and `variables`."""

from typing import Any, Dict, Optional


class ByTableConfig(dict):
  """Keyed by the resolved `TableConfig`s; the user's own `TableConfig`
  objects and the tables' names are accepted as keys too."""

  def __init__(self, items, aliases: Optional[Dict[int, Any]] = None):
    super().__init__(items)
    self._aliases = aliases or {}  # id(user's TableConfig) -> resolved

  def _key(self, key):
    if isinstance(key, str):
      return next((table for table in self if table.name == key), None)
    return self._aliases.get(id(key))

  def __missing__(self, key):
    resolved = self._key(key)
    if resolved is None or not dict.__contains__(self, resolved):
      raise KeyError(key)
    return self[resolved]

  def __contains__(self, key):
    return dict.__contains__(self, key) or self._key(key) is not None
