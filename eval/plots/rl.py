"""Charts of the RL stage: how hard the training prompts are for the starting policy."""

from __future__ import annotations

import matplotlib.pyplot as plt


def pass_rate_histogram(per_domain: dict[str, list[float]], samples: int):
    """One bar group per pass rate k/samples, one colour per domain: prompts at 1.0 are dropped by
    the difficulty filter, the ones in between are where GRPO finds reward variance."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ks = list(range(samples + 1))
    domains = sorted(per_domain)
    width = 0.8 / max(len(domains), 1)
    for j, domain in enumerate(domains):
        counts = [sum(1 for r in per_domain[domain] if round(r * samples) == k) for k in ks]
        ax.bar([k + (j - (len(domains) - 1) / 2) * width for k in ks], counts, width, label=domain)
    ax.set_xticks(ks, [f"{k}/{samples}" for k in ks])
    ax.set_xlabel("pass rate under the starting policy")
    ax.set_ylabel("prompts")
    solved = sum(1 for v in per_domain.values() for r in v if r >= 1.0)
    middle = sum(1 for v in per_domain.values() for r in v if 0 < r < 1)
    total = sum(len(v) for v in per_domain.values())
    ax.set_title(f"RL difficulty profile: {middle} of {total} prompts have signal, {solved} always solved (dropped)")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig
