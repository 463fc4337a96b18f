"""The quantization report's chart: each operator's format, and where the weights and FLOPs went.

Accuracy before/after is drawn by `before_after_plot` (every kind of score on its own axis); this
chart is the format side: one bar per operator (length = its weights, colour = its format, in
module order, so a reader sees which layers went to NVFP4), and the weight and FLOP shares per format.
Each format's colour is its own (`QuantFormat.colour`, stagewise/quant/formats/), and the shares are
drawn in the registry's order.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from stagewise.quant.formats import FORMATS, format_named


def quant_formats_plot(report: dict):
    table = report["table"]
    fig, (ax_ops, ax_share) = plt.subplots(1, 2, figsize=(12, max(3.5, 0.22 * len(table) + 1.5)),
                                           gridspec_kw={"width_ratios": [1.6, 1]})
    for i, row in enumerate(table):
        ax_ops.barh(i, row["weights"], color=format_named(row["format"]).colour)
        ax_ops.text(row["weights"], i, f" {row['format']}" + ("" if row["searched"] else " (kept)"), va="center", fontsize=7)
    ax_ops.set_yticks(range(len(table)), [r["module"] for r in table], fontsize=7)
    ax_ops.invert_yaxis()
    ax_ops.set_xlabel("weights (elements)")
    ax_ops.set_title("format per operator", fontsize=10)
    formats = [f for f in FORMATS if report["weight_share"].get(f) or report["flop_share"].get(f)]
    for row, key in enumerate(("weight_share", "flop_share")):
        left = 0.0
        for fmt in formats:
            share = report[key].get(fmt, 0.0)
            ax_share.barh(row, share, left=left, color=format_named(fmt).colour, label=fmt if row == 0 else None)
            if share > 0.06:
                ax_share.text(left + share / 2, row, f"{share:.0%}", ha="center", va="center", color="white", fontsize=9)
            left += share
    ax_share.set_yticks([0, 1], ["weights", "FLOPs"])
    ax_share.set_xlim(0, 1)
    ax_share.set_xlabel("share of the model's operators")
    ax_share.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    ax_share.set_title(f"{report['effective_bits']:.2f} effective bits (searched), {report['effective_bits_all']:.2f} (all)",
                       fontsize=10)
    fig.suptitle(f"Quantization by {report['method']} on {report['device']}"
                 + (" (NVFP4 emulated in PyTorch)" if report["emulated"] else ""), fontsize=11)
    fig.tight_layout()
    return fig
