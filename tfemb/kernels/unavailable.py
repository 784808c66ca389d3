"""Why no build of the fused kernels can be had, said in one warning line:
the cause, that the host engine uses TensorFlow's ops, and the remedy,
never a compiler's output (that goes to a log file the line names)."""

import re
from typing import Optional


class KernelUnavailable(RuntimeError):
  """No build of the kernels: `reason` is one line, `log` the file with the
  compiler's whole output (or None)."""

  def __init__(self, reason: str, remedy: str, log: Optional[str] = None):
    super().__init__(reason)
    self.reason = reason
    self.remedy = remedy
    self.log = log

  def warning(self) -> str:
    text = (f"tfemb: fused CPU kernels unavailable: {self.reason}. The host "
            f"engine uses TensorFlow's ops (same numbers, about 2x slower). "
            f"{self.remedy}")
    if self.log:
      text += f" Compiler output: {self.log}"
    return text


def first_error(output: str) -> str:
  """The compiler's first error line (or its last line), shortened."""
  lines = [l.strip() for l in output.splitlines() if l.strip()]
  errors = [l for l in lines if "error:" in l.lower()]
  line = (errors or lines or ["no output"])[0]
  line = re.sub(r"^[^\s:]*/([^/\s:]+:\d+)", r"\1", line)  # file name only
  return line if len(line) <= 300 else line[:297] + "..."
