"""Files written whole or not at all: a reader never finds half a file.

Used wherever tfemb writes a file another process may read at the same
time (the kernel cache, the command line's outputs).
"""

import os
import threading


def write_text(path: str, text: str) -> None:
  """`text` into `path`, written whole: a temporary file beside it (named
  for this process and thread), then renamed over it; the temporary file
  never stays behind."""
  partial = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
  try:
    with open(partial, "w") as f:
      f.write(text)
    os.replace(partial, path)
  finally:
    if os.path.exists(partial):
      os.remove(partial)
