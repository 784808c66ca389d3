"""TCP bytes per process, from `ss -tinpHe` (iproute2; Linux).

gRPC's sendmsg/recvmsg do not show in `/proc/<pid>/io`, so a process's
network traffic is read from the kernel's per-socket counters
(`bytes_sent`, `bytes_received` of `tcp_info`), attributed to the process
that holds the socket. A count is a snapshot: `delta` subtracts two, per
socket, so sockets opened in between count from zero.
"""

import re
import subprocess
from typing import Dict, Iterable, Tuple

# {pid: {socket inode: (bytes sent, bytes received)}}
Snapshot = Dict[int, Dict[str, Tuple[int, int]]]

_PID = re.compile(r"pid=(\d+)")
_INODE = re.compile(r"\bino:(\d+)")
_SENT = re.compile(r"\bbytes_sent:(\d+)")
_RECEIVED = re.compile(r"\bbytes_received:(\d+)")


def parse(text: str, pids: Iterable[int]) -> Snapshot:
  """The sockets of `pids` in the output of `ss -tinpHe`: each socket is a
  line with its addresses, process and inode, then indented lines of
  `tcp_info` (a counter still at zero is left out)."""
  wanted = set(pids)
  out: Snapshot = {pid: {} for pid in wanted}
  owners, inode = [], None
  for line in text.splitlines():
    if not line.startswith((" ", "\t")):
      owners = [p for p in map(int, _PID.findall(line)) if p in wanted]
      match = _INODE.search(line)
      inode = match.group(1) if match else None
      continue
    if not owners or inode is None:
      continue
    sent, received = _SENT.search(line), _RECEIVED.search(line)
    if sent is None and received is None:
      continue
    counts = (int(sent.group(1)) if sent else 0,
              int(received.group(1)) if received else 0)
    for pid in owners:
      out[pid][inode] = counts
  return out


def snapshot(pids: Iterable[int]) -> Snapshot:
  try:
    text = subprocess.run(["ss", "-tinpHe"], capture_output=True, text=True,
                          check=True, timeout=60).stdout
  except FileNotFoundError:
    raise RuntimeError("`ss` not found: install iproute2 (e.g. "
                       "`apt-get install iproute2`)") from None
  return parse(text, pids)


def delta(before: Snapshot, after: Snapshot) -> Dict[int, Dict[str, int]]:
  """{pid: {"sent": bytes, "received": bytes}} between two snapshots."""
  out = {}
  for pid, sockets in after.items():
    sent = received = 0
    for inode, (s, r) in sockets.items():
      s0, r0 = before.get(pid, {}).get(inode, (0, 0))
      sent += s - s0
      received += r - r0
    out[pid] = {"sent": sent, "received": received}
  return out
