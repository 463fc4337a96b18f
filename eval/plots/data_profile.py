"""The data profile's dashboard: lengths, domain shares, turns, tools, rejects and the warnings.

Drawn from the report's JSON (`DataProfile.model_dump()`), so a saved profile can be drawn again.
Seven panels, each answering one question a person asks before training: how long are the
documents and the conversations (per domain) against the sequence/pack lengths they train at;
does one domain dominate the conversations or the tokens; how many turns; which tools are
called; what curation threw away and why; and, across the bottom, the warnings.
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from stagewise.data.profile_warnings import DOMAIN_SHARE_MAX, TOOL_SHARE_MAX


def _empty(ax: Axes, title: str, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=9, color="0.4", transform=ax.transAxes)
    ax.set_title(title, fontsize=9, loc="left")
    ax.set_axis_off()


def lengths_panel(ax: Axes, sources: list[dict], title: str) -> None:
    """Share of each source's items per log2 length bin; dashed lines at the lengths they train at."""
    if not sources:
        return _empty(ax, title, "no sources")
    ax.set_prop_cycle(color=[plt.get_cmap("tab10")(i % 10) for i in range(len(sources))])
    for s in sources:
        t = s["tokens"]
        if not t["count"]:
            continue
        shares = [c / t["count"] for c in t["hist_counts"]]
        ax.step(t["hist_edges"], [*shares, shares[-1]], where="post", label=f"{s['name']} (p99 {t['p99']:,})")
    limits = sorted({(n, label) for s in sources for label, n in s["limits"].items()})
    for n, label in limits:
        ax.axvline(n, color="0.3", linestyle="--", linewidth=0.8)
        ax.text(n, 1.0, f" {label} {n:,}", rotation=90, va="top", fontsize=6, transform=ax.get_xaxis_transform())
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens (log2 bins)", fontsize=8)
    ax.set_ylabel("share of the items", fontsize=8)
    ax.set_title(title, fontsize=9, loc="left")
    ax.legend(frameon=False, fontsize=6)
    ax.grid(alpha=0.3)


def domains_panel(ax: Axes, domains: list[dict]) -> None:
    """Conversation and token share per SFT domain, with the skew threshold."""
    if not domains:
        return _empty(ax, "SFT domains", "no conversations")
    ys = range(len(domains))
    ax.barh([y - 0.2 for y in ys], [d["conversation_share"] for d in domains], 0.4, label="conversations",
            color="tab:blue", alpha=0.75)
    ax.barh([y + 0.2 for y in ys], [d["token_share"] for d in domains], 0.4, label="tokens", color="tab:orange",
            alpha=0.75)
    ax.axvline(DOMAIN_SHARE_MAX, color="tab:red", linestyle=":", linewidth=1)
    ax.set_yticks(list(ys), [d["domain"] for d in domains], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of the SFT data", fontsize=8)
    top = max(domains, key=lambda d: d["token_share"])
    ax.set_title(f"SFT domains: {top['domain']} has the most tokens ({top['token_share']:.0%})", fontsize=9, loc="left")
    ax.legend(frameon=False, fontsize=7)
    ax.grid(alpha=0.3, axis="x")


def turns_panel(ax: Axes, sources: list[dict]) -> None:
    """Mean messages and assistant turns per conversation, per SFT source (max and reasoning traces printed)."""
    if not sources:
        return _empty(ax, "turns per conversation", "no conversations")
    ys = range(len(sources))
    msgs = [s["messages"]["mean"] for s in sources]
    ax.barh([y - 0.2 for y in ys], msgs, 0.4, label="messages", color="tab:blue", alpha=0.75)
    ax.barh([y + 0.2 for y in ys], [s["assistant_turns"]["mean"] for s in sources], 0.4, label="assistant turns",
            color="tab:green", alpha=0.75)
    for y, s in zip(ys, sources):
        ax.text(msgs[y], y - 0.2, f" max {s['messages']['max']}", va="center", fontsize=6)
        trace = s["reasoning_tokens"]
        note = (f" trace {trace['mean']:.0f} tokens in {s['reasoning_turn_share']:.0%} of turns" if trace["count"]
                else " no traces")
        ax.text(s["assistant_turns"]["mean"], y + 0.2, note, va="center", fontsize=6)
    ax.set_yticks(list(ys), [s["name"] for s in sources], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("per conversation (mean)", fontsize=8)
    ax.set_title("turns per conversation, reasoning traces", fontsize=9, loc="left")
    ax.legend(frameon=False, fontsize=7)
    ax.grid(alpha=0.3, axis="x")


def tools_panel(ax: Axes, tools: dict) -> None:
    """Share of tool calls per tool, with the skew threshold."""
    if not tools["calls"]:
        return _empty(ax, "tool calls", "no tool calls")
    names = sorted(tools["per_tool"], key=lambda n: -tools["per_tool"][n])
    shares = [tools["per_tool"][n] / tools["calls"] for n in names]
    bars = ax.barh(range(len(names)), shares, color="tab:purple", alpha=0.75)
    for bar, n in zip(bars, names):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {tools['per_tool'][n]:,}", va="center",
                fontsize=7)
    ax.axvline(TOOL_SHARE_MAX, color="tab:red", linestyle=":", linewidth=1)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_ylim(max(len(names), 4) - 0.5, -0.5)  # a bar keeps its height with few tools
    ax.set_xlim(0, 1.15)
    ax.set_xlabel("share of tool calls", fontsize=8)
    ax.set_title(f"tool calls: {tools['calls']:,} in {tools['conversations']:,} conversations", fontsize=9, loc="left")
    ax.grid(alpha=0.3, axis="x")


def rejects_panel(ax: Axes, sources: list[dict]) -> None:
    """Rejected lines per SFT source, stacked by reason (counts printed)."""
    curated = [s for s in sources if s.get("curation")]
    if not curated:
        return _empty(ax, "curation", "no curation report")
    reasons = sorted({r for s in curated for r in s["curation"]["rejected"]})
    colours, labelled = plt.get_cmap("tab20"), set()
    for y, s in enumerate(curated):
        left = 0
        for i, r in enumerate(reasons):
            n = s["curation"]["rejected"].get(r, 0)
            if n:
                ax.barh(y, n, left=left, color=colours(i % 20), label=None if r in labelled else r)
                labelled.add(r)
                left += n
        ax.text(left, y, f" {left} of {s['curation']['total']:,}", va="center", fontsize=7)
    if labelled:
        ax.legend(frameon=False, fontsize=6, loc="center right")
    ax.set_yticks(range(len(curated)), [s["name"] for s in curated], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("rejected lines", fontsize=8)
    total = sum(sum(s["curation"]["rejected"].values()) for s in curated)
    lines = sum(s["curation"]["total"] for s in curated)
    ax.set_title(f"curation: rejected {total:,} of {lines:,} lines", fontsize=9, loc="left")
    ax.grid(alpha=0.3, axis="x")


def _domain_limits(domain: dict, sources: list[dict]) -> dict[str, int]:
    """The pack sizes of the sources pooled into a domain."""
    return {label: n for s in sources if s["name"] in domain["sources"] for label, n in s["limits"].items()}


def warnings_panel(ax: Axes, warnings: list[dict]) -> None:
    """The warnings as wrapped text, most important (tools, domains) first."""
    text = "\n".join(textwrap.fill(f"- {w['message']}", 160, subsequent_indent="  ") for w in warnings[:10])
    if len(warnings) > 10:
        text += f"\n... and {len(warnings) - 10} more (profile JSON)"
    ax.text(0.0, 1.0, text or "no skew above the thresholds", va="top", fontsize=7, transform=ax.transAxes,
            color="tab:red" if warnings else "tab:green")
    ax.set_title(f"{len(warnings)} warning(s)", fontsize=9, loc="left")
    ax.set_axis_off()


def data_profile_plot(report: dict, title: str = ""):
    """The dashboard of a `DataProfile` JSON dict (see the module docstring)."""
    sft = report["sft_sources"]
    fig = plt.figure(figsize=(16, 10.5), dpi=100)
    grid = fig.add_gridspec(3, 3, height_ratios=[1, 1, 0.5])
    axes = [[fig.add_subplot(grid[row, col]) for col in range(3)] for row in range(2)]
    if report["text_sources"] or not sft:
        lengths_panel(axes[0][0], report["text_sources"], "pretraining text: token length per document")
    else:  # an SFT-only profile (the SFT stage's): the sources the domains pool
        lengths_panel(axes[0][0], sft, "SFT: token length per conversation, by source")
    lengths_panel(axes[0][1], [{**d, "name": d["domain"], "tokens": d["lengths"], "limits": _domain_limits(d, sft)}
                               for d in report["domains"]], "SFT: token length per conversation, by domain")
    domains_panel(axes[0][2], report["domains"])
    turns_panel(axes[1][0], sft)
    tools_panel(axes[1][1], report["tools"])
    rejects_panel(axes[1][2], sft)
    warnings_panel(fig.add_subplot(grid[2, :]), report["warnings"])
    n = len(report["text_sources"]) + len(sft)
    fig.suptitle(f"{title or 'Data profile'}: {n} source(s), {len(report['warnings'])} warning(s)", fontsize=11)
    fig.tight_layout()
    return fig
