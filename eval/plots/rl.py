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


def rl_training_plot(histories: dict[str, list[tuple[int, int, float]]], before: dict[str, float],
                     after: dict[str, float]):
    """Three panels: reward components per step (rates, 0-1), how many groups carried signal and
    the masked-IS / clip fractions, and held-out pass@1 per domain before -> after."""
    fig, (ax_r, ax_g, ax_h) = plt.subplots(1, 3, figsize=(13, 3.8))
    for name, points in sorted(histories.items()):
        if name.startswith("rl/reward/") and not name.endswith("unjudged") and points:
            ax_r.plot([s for s, _, _ in points], [v for _, _, v in points], label=name.removeprefix("rl/reward/"))
    ax_r.set_ylim(0, 1.05)
    ax_r.set_xlabel("step")
    ax_r.set_title("reward per component (mean over rollouts)")
    ax_r.legend(frameon=False, fontsize=8)
    kept, groups = histories.get("rl/kept_groups", []), histories.get("rl/groups", [])
    if kept and groups:
        ax_g.plot([s for s, _, _ in kept], [k / max(g, 1) for (_, _, k), (_, _, g) in zip(kept, groups)],
                  label="groups kept (reward variance)")
    for name, label in (("rl/is_masked_fraction", "tokens masked by IS"), ("rl/clip_fraction", "tokens clipped")):
        points = histories.get(name, [])
        if points:
            ax_g.plot([s for s, _, _ in points], [v for _, _, v in points], label=label)
    ax_g.set_ylim(0, 1.05)
    ax_g.set_xlabel("step")
    ax_g.set_title("signal and off-policy correction")
    ax_g.legend(frameon=False, fontsize=8)
    names = sorted(k for k in before if "/pass_at_1/" in k and k in after)
    tested = [k for k in names if "/test/" in k]  # the split the closing table reports (eval/splits.py)
    names = tested or names
    labels = [k.rsplit("/", 1)[1] for k in names]
    for i, k in enumerate(names):
        ax_h.plot([i, i], [before[k], after[k]], color="0.7")
        ax_h.scatter([i], [before[k]], color="0.5", zorder=3, label="SFT" if i == 0 else None)
        ax_h.scatter([i], [after[k]], color="tab:green" if after[k] >= before[k] else "tab:red", zorder=3,
                     label="RL" if i == 0 else None)
    ax_h.set_xticks(range(len(names)), labels)
    ax_h.set_ylim(0, max([0.5, *before.values(), *after.values()]) * 1.1)
    gains = [after[k] - before[k] for k in names]
    ax_h.set_title(("test" if tested else "held-out") + " pass@1: " + ", ".join(f"{lab} {g:+.2f}" for lab, g in zip(labels, gains)))
    ax_h.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig
