#!/usr/bin/env python3
"""Sums per-kernel GPU time of one profiled decode step from `ncu --csv --metrics
gpu__time_duration.sum` output (see scripts/gpu-check.sh, mode `step`): total, and per kernel
family (name up to the template arguments) with counts, largest first."""
import csv
import re
import sys
from collections import defaultdict


def family(name):
    name = name.replace("(anonymous namespace)::", "")
    name = re.sub(r"\(.*$", "", name)             # drop the parameter list
    name = re.sub(r"^(void )?(dsv4::)?", "", name)
    return name.replace("cuda::", "").replace("detail::", "")


def main(path):
    rows = [r for r in csv.reader(open(path, errors="replace")) if r]
    head = next(i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Value" in r)
    cols = rows[head]
    k, u, v = cols.index("Kernel Name"), cols.index("Metric Unit"), cols.index("Metric Value")
    total, fam = 0.0, defaultdict(lambda: [0.0, 0])
    for r in rows[head + 1:]:
        if len(r) <= v:
            continue
        try:
            val = float(r[v].replace(",", ""))
        except ValueError:
            continue
        # ncu names the unit "ns" / "nsecond" (by version); durations are summed in us.
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
        if r[u] not in scale:
            sys.exit(f"ncu_step_summary: unknown duration unit '{r[u]}'")
        us = val * scale[r[u]]
        total += us
        f = fam[family(r[k])]
        f[0] += us
        f[1] += 1
    print(f"kernels: {sum(c for _, c in fam.values())}, sum of durations: {total:.1f} us")
    for name, (us, n) in sorted(fam.items(), key=lambda x: -x[1][0])[:40]:
        print(f"  {us:9.1f} us {n:5d}x  {100 * us / total:5.1f}%  {name[:110]}")


if __name__ == "__main__":
    main(sys.argv[1])
