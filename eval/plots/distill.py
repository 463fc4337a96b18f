"""Chart of the distillation stage: is the student closing on its teachers, and did it keep their gains."""

from __future__ import annotations

import matplotlib.pyplot as plt


def distill_plot(reverse_kl: dict[str, list[tuple[int, float]]], start: dict[str, float], distilled: dict[str, float],
                 teachers: dict[str, float]):
    """Two panels: the sampled reverse KL to each domain's teacher per step (falling: the student
    is moving toward the teachers), and held-out pass@1 per domain for the student's start, each
    domain's teacher and the distilled student (the gap the student closed)."""
    fig, (ax_kl, ax_p) = plt.subplots(1, 2, figsize=(11, 3.8))
    for domain, points in sorted(reverse_kl.items()):
        ax_kl.plot([s for s, _ in points], [v for _, v in points], label=domain)
    ax_kl.set_xlabel("step")
    ax_kl.set_ylabel("nats / token")
    ax_kl.set_title("reverse KL to the domain's teacher (student samples)")
    if reverse_kl:
        ax_kl.legend(frameon=False)
    domains = sorted(start)
    xs = range(len(domains))
    for offset, (label, values) in zip((-0.27, 0.0, 0.27), (("student start", start), ("teacher", teachers),
                                                            ("distilled", distilled))):
        ax_p.bar([x + offset for x in xs], [values.get(d, 0.0) for d in domains], 0.26, label=label)
    ax_p.set_xticks(list(xs), domains)
    ax_p.set_ylabel("held-out pass@1")
    closed = [(distilled[d] - start[d]) / (teachers[d] - start[d]) for d in domains
              if d in teachers and d in distilled and teachers[d] > start[d]]
    kept = ", ".join(f"{c:.0%}" for c in closed)
    ax_p.set_title(f"pass@1 per domain (gain kept: {kept})" if closed else "pass@1 per domain")
    ax_p.legend(frameon=False)
    fig.tight_layout()
    return fig
