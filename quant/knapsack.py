"""The multiple-choice knapsack that picks one format per operator group.

AutoQuantize (docs/ALGORITHMS.md §8) scores every operator group under every candidate format
(sensitivity: how much the loss moves) and prices it (effective bits or FLOPs at that
precision). Choosing one option per group to minimise the summed score within a cost budget is
a multiple-choice knapsack; it is small (groups x formats binaries), so we solve it exactly
as a binary ILP with PuLP's bundled CBC solver rather than greedily.

    from stagewise.quant.knapsack import solve
    choice = solve([[(0.0, 16.0), (0.3, 8.0), (1.2, 4.0)], ...], budget=...)

The interface is plain numbers: no modelopt types, so it is testable and reusable alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulp

from stagewise.data.errors import BadInput

# A budget equal to a feasible total (up to float rounding of the sum) counts as feasible.
REL_TOL = 1e-9


@dataclass(frozen=True)
class Choice:
    """The solution: the option index chosen in each group, and its summed score and cost."""

    picks: list[int]
    score: float
    cost: float


def _check(groups: list[list[tuple[float, float]]], budget: float) -> float:
    """BadInput for an empty group or an infeasible budget; the budget with its tolerance."""
    empty = [i for i, g in enumerate(groups) if not g]
    if empty:
        raise BadInput(f"knapsack: group {empty[0]} has no options")
    min_cost = sum(min(c for _, c in g) for g in groups)
    slack = REL_TOL * max(1.0, abs(budget), abs(min_cost))
    if min_cost > budget + slack:
        raise BadInput(f"knapsack: budget {budget:g} is below the minimum achievable cost {min_cost:g}")
    return budget + slack


def solve(groups: list[list[tuple[float, float]]], budget: float) -> Choice:
    """Pick one (score, cost) option per group minimising the summed score, summed cost <= budget.

    Exact: a binary ILP (one binary per option, exactly one per group, one cost constraint)
    solved by CBC. Raises BadInput naming the minimum achievable cost when the budget is too small.
    """
    limit = _check(groups, budget)
    # Scale scores and costs to O(1) so CBC's absolute tolerances (~1e-7) mean the same for
    # sensitivities of 1e-9 and FLOPs of 1e12; neither scaling changes the optimum.
    s_unit = max((abs(s) for g in groups for s, _ in g), default=0.0) or 1.0
    c_unit = max([abs(c) for g in groups for _, c in g] + [abs(limit)]) or 1.0
    prob = pulp.LpProblem("format_choice", pulp.LpMinimize)
    x = [[pulp.LpVariable(f"x_{g}_{o}", cat=pulp.LpBinary) for o in range(len(opts))] for g, opts in enumerate(groups)]
    options = [(x[g][o], s, c) for g, opts in enumerate(groups) for o, (s, c) in enumerate(opts)]
    prob += pulp.lpSum((s / s_unit) * v for v, s, _ in options)
    for g, xs in enumerate(x):
        prob += pulp.lpSum(xs) == 1, f"one_{g}"
    prob += pulp.lpSum((c / c_unit) * v for v, _, c in options) <= limit / c_unit, "budget"
    status = prob.solve(pulp.PULP_CBC_CMD(msg=False))
    if pulp.LpStatus[status] != "Optimal":
        raise RuntimeError(f"knapsack: CBC ended {pulp.LpStatus[status]} on a feasible instance")
    picks = [max(range(len(xs)), key=lambda o: xs[o].value() or 0.0) for xs in x]
    return Choice(
        picks=picks,
        score=sum(groups[g][o][0] for g, o in enumerate(picks)),
        cost=sum(groups[g][o][1] for g, o in enumerate(picks)),
    )
