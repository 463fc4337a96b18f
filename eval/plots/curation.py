"""SFT curation at a glance: kept and rejected conversations per source (counts only)."""

from __future__ import annotations

import matplotlib.pyplot as plt


def reject_reasons_plot(rejected: dict[str, dict[str, int]], kept: dict[str, int], title: str = ""):
    """Curation at a glance: per source, a horizontal bar of kept lines and one per reject reason.

    `rejected` maps a source to {reason: count}, `kept` a source to its kept count. Counts are
    printed on the bars, so the picture doubles as the table.
    """
    rows = [(src, "kept", kept.get(src, 0)) for src in kept]
    rows += [(src, reason, n) for src in rejected for reason, n in sorted(rejected[src].items())]
    rows.sort(key=lambda r: (r[0], r[1] != "kept", r[1]))
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(rows) + 1.2), dpi=110)
    labels = [f"{src}: {reason}" for src, reason, _ in rows]
    counts = [n for _, _, n in rows]
    colours = ["tab:green" if reason == "kept" else "tab:red" for _, reason, _ in rows]
    bars = ax.barh(range(len(rows)), counts, color=colours, alpha=0.75)
    ax.set_xscale("symlog", linthresh=10)
    for bar, n in zip(bars, counts):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {n}", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("conversations (log scale)")
    total_kept, total = sum(kept.values()), sum(counts)
    share = f": kept {total_kept:,} of {total:,} conversations" if total else ""
    ax.set_title((title or "SFT curation: kept and rejected per source") + share)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig
