"""SFT packing: our best-fit decreasing against a first-fit baseline, on the same lengths.

    python benchmarks/packing.py [--n 20000] [--pack-size 4096] [--json]

The length mix imitates an SFT blend: mostly short chat turns (log-normal, median ~350
tokens), a tail of long reasoning traces and long-context documents (10% between 1,500
and the pack size) and a few longer than a pack (dropped by both). Both packers see the
same lengths:
- bfd:        data.packing.best_fit_decreasing (sorted longest first, best fit via bisect
              over open packs' room; with the distinct-prompt rule, every item its own prompt);
- first_fit:  the common baseline, items in arrival order, each into the first pack with
              room (a scan over the packs), no sorting.
Reported: conversations/s of each and their ratio, packing efficiency (packed tokens /
capacity) of each and their ratio, all measured in this run (best of --repeat runs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from stagewise.data.packing import best_fit_decreasing  # noqa: E402


def length_mix(n: int, pack_size: int, seed: int = 0) -> list[int]:
    """Realistic SFT lengths: 89% short (log-normal), 10% long, 1% longer than a pack."""
    rng = np.random.default_rng(seed)
    short = np.clip(rng.lognormal(np.log(350), 0.7, n), 16, pack_size).astype(int)
    long = rng.integers(1500, pack_size + 1, n)
    over = rng.integers(pack_size + 1, 2 * pack_size, n)
    kind = rng.random(n)
    return np.where(kind < 0.89, short, np.where(kind < 0.99, long, over)).tolist()


def first_fit(lengths: list[int], pack_size: int) -> tuple[list[int], int]:
    """Arrival-order first fit: (room left per pack, dropped count)."""
    rooms: list[int] = []
    dropped = 0
    for n in lengths:
        if n > pack_size:
            dropped += 1
            continue
        for i, room in enumerate(rooms):
            if room >= n:
                rooms[i] = room - n
                break
        else:
            rooms.append(pack_size - n)
    return rooms, dropped


def timed(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--pack-size", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    lengths = length_mix(args.n, args.pack_size)
    keys = list(range(args.n))
    t_bfd, report = timed(lambda: best_fit_decreasing(lengths, args.pack_size, keys), args.repeat)
    t_ff, (rooms, ff_dropped) = timed(lambda: first_fit(lengths, args.pack_size), args.repeat)
    ff_eff = 1 - sum(rooms) / (len(rooms) * args.pack_size)
    out = {
        "conversations": args.n, "pack_size": args.pack_size,
        "bfd": {"conv_per_s": args.n / t_bfd, "packs": len(report.packs), "efficiency": report.efficiency,
                "dropped": report.dropped},
        "first_fit": {"conv_per_s": args.n / t_ff, "packs": len(rooms), "efficiency": ff_eff, "dropped": ff_dropped},
    }
    out["speed_ratio_bfd_over_first_fit"] = out["bfd"]["conv_per_s"] / out["first_fit"]["conv_per_s"]
    out["efficiency_ratio_bfd_over_first_fit"] = report.efficiency / ff_eff
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for name in ("bfd", "first_fit"):
        r = out[name]
        print(f"{name:>10}: {r['conv_per_s']:>12,.0f} conv/s  {r['packs']:>6} packs  efficiency {r['efficiency']:.4f}"
              f"  dropped {r['dropped']}")
    print(f"speed bfd/first_fit = {out['speed_ratio_bfd_over_first_fit']:.2f}x, "
          f"efficiency bfd/first_fit = {out['efficiency_ratio_bfd_over_first_fit']:.4f}")


if __name__ == "__main__":
    main()
