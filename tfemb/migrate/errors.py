"""The converter's one kind of refusal: which file, and why."""

import contextlib
import re

import tensorflow as tf


class ConversionError(ValueError):
  """A conversion refused. `path`: the checkpoint or file it concerns;
  `reason`: one line. A ValueError, as the converter's checks always were."""

  def __init__(self, path: str, reason: str):
    super().__init__(f"{path}: {reason}")
    self.path, self.reason = path, reason


def first_line(error: BaseException) -> str:
  """An error's first line, without the op context TensorFlow adds
  ("{{function_node ...}} ... [Op:RestoreV2]")."""
  text = error.message if isinstance(error, tf.errors.OpError) else str(error)
  text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
  lines = [line for line in text.strip().splitlines() if line.strip()]
  line = lines[0] if lines else type(error).__name__
  return re.sub(r"\s*\[Op:\w+\]( name: \S*)?$", "", line)


@contextlib.contextmanager
def about(path: str):
  """Errors raised inside (bad values, files, TensorFlow's I/O) become
  ConversionErrors naming `path`, unless they already name theirs."""
  try:
    yield
  except ConversionError:
    raise
  except (ValueError, OSError, tf.errors.OpError) as e:
    raise ConversionError(path, first_line(e)) from e
