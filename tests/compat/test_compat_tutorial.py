"""tutorials/migrate_from_tpuestimator.md runs as written.

Its `python` blocks run in order in one namespace (the `py` blocks are the
old TPUEstimator code and are not run); then its claims are checked.
"""

import re

import numpy as np

import helpers

TUTORIAL = helpers.ROOT / "tutorials" / "migrate_from_tpuestimator.md"


def test_tutorial_runs_and_does_what_it_says(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  text = TUTORIAL.read_text()
  blocks = re.findall(r"```python\n(.*?)```", text, re.S)
  assert len(blocks) >= 5
  assert re.search(r"```py\n.*TPUEstimator\(", text, re.S)
  namespace = {}
  for block in blocks:
    exec(compile(block, str(TUTORIAL), "exec"), namespace)  # pylint: disable=exec-used
  tfemb = namespace["tfemb"]
  assert namespace["spec"].optimizer() == tfemb.SGD(0.1,
                                                     clipvalue=(-1.0, 1.0))
  tables = {t.name: t for t in namespace["embedding"].embedding_tables}
  assert sorted(tables) == ["tbl_history_item_shared_embedding", "tbl_user"]
  losses = namespace["losses"]
  assert len(losses) == 30 and all(np.isfinite(losses))
  # Training moved the restored table away from the old checkpoint's values.
  old = namespace["old_values"]
  user = namespace["embedding"].embedding_tables[tables["tbl_user"]]
  assert not np.array_equal(
      user.numpy(), old["dense_features/user_embedding/embedding_weights"])
  # Section 6: the Keras model with the tfemb layer trained from the
  # restored tables, by the TPUEstimator-era optimizer.
  keras_losses = namespace["history"].history["loss"]
  assert len(keras_losses) == 2 and all(np.isfinite(keras_losses))
  layer = namespace["layer"]
  assert sorted(t.name for t in layer.embedding_tables) == sorted(tables)
  layer_user = next(v for t, v in layer.embedding_tables.items()
                    if t.name == "tbl_user")
  assert not np.array_equal(layer_user.numpy(), user.numpy())
  assert dict(layer._table_config_map)[next(iter(layer.embedding_tables))]\
      .optimizer == tfemb.SGD(0.1, clipvalue=(-1.0, 1.0))  # pylint: disable=protected-access
