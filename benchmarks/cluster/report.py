"""The runs' report: a markdown table per run and process, and the ratios
tfemb / Keras of steps per second, bytes per step and peak RSS."""

from typing import Dict, List


def totals(result: dict) -> dict:
  per = result["per_process"].values()
  return {"steps_per_s": result["steps_per_s"],
          "bytes_per_step": sum(p["sent_per_step"] for p in per),
          "peak_rss": max(p["peak_rss"] or 0 for p in per),
          "rss_total": sum(p["peak_rss"] or 0 for p in per)}


def ratios(results: List[dict]) -> Dict[str, dict]:
  """{"ps/adam": {"speed": tfemb/keras steps/s, "bytes": .., "rss": ..}}"""
  by = {(r["strategy"], r["optimizer"], r["stack"]): totals(r)
        for r in results if r.get("status") == "ok"}
  out = {}
  for (strategy, optimizer, stack), t in sorted(by.items()):
    k = by.get((strategy, optimizer, "keras"))
    if stack != "tfemb" or k is None:
      continue
    out[f"{strategy}/{optimizer}"] = {
        "speed": t["steps_per_s"] / k["steps_per_s"],
        "bytes": t["bytes_per_step"] / k["bytes_per_step"],
        "rss": t["peak_rss"] / k["peak_rss"]}
  return out


def mib(x) -> str:
  return f"{x / 2**20:.2f}"


def markdown(args, results: List[dict]) -> str:
  lines = [
      f"`python -m benchmarks.cluster {' '.join(args.argv)}`".replace(
          "  ", " ").replace(" `", "`"),
      "",
      f"{args.vocab} rows per table x 8 tables x dim 32, batch "
      f"{args.batch}; ps: 1 coordinator, {args.workers} workers, {args.ps} "
      f"parameter servers; mwms: {args.workers} workers; "
      f"{args.epochs * args.steps} timed steps after "
      f"{args.warmup_epochs * args.steps} warm-up steps.", "",
      "| strategy | optimizer | stack | steps/s | MiB sent/step (all) | "
      "per process: MiB sent / received per step, CPU ms per step, "
      "peak RSS MiB |",
      "|---|---|---|---|---|---|"]
  for r in results:
    if r.get("status") != "ok":
      lines.append(f"| {r['strategy']} | {r['optimizer']} | {r['stack']} | "
                   f"failed: {r.get('error', '')[:80]} | | |")
      continue
    t = totals(r)
    per = ", ".join(f"{n}: {mib(p['sent_per_step'])} / "
                    f"{mib(p['received_per_step'])}, "
                    f"{p['cpu_s_per_step'] * 1e3:.0f}, "
                    f"{(p['peak_rss'] or 0) / 2**20:.0f}"
                    for n, p in r["per_process"].items())
    lines.append(f"| {r['strategy']} | {r['optimizer']} | {r['stack']} | "
                 f"{t['steps_per_s']:.2f} | {mib(t['bytes_per_step'])} | "
                 f"{per} |")
  lines += ["", "| tfemb / Keras | steps/s | bytes/step | peak RSS |",
            "|---|---|---|---|"]
  for key, r in ratios(results).items():
    lines.append(f"| {key} | {r['speed']:.2f} | {r['bytes']:.2f} | "
                 f"{r['rss']:.2f} |")
  return "\n".join(lines) + "\n"


def summary_line(results: List[dict]) -> str:
  parts = [f"{k} speed {r['speed']:.2f}x bytes {r['bytes']:.2f}x "
           f"rss {r['rss']:.2f}x" for k, r in ratios(results).items()]
  failed = [f"{r['strategy']}/{r['optimizer']}/{r['stack']}"
            for r in results if r.get("status") != "ok"]
  return ("cluster: tfemb/Keras " + "; ".join(parts)
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
