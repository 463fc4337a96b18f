"""The multiple-choice knapsack: exact against brute force, infeasible budgets, scale."""

import itertools
import random

import pytest

from stagewise.data.errors import BadInput
from stagewise.quant.knapsack import solve


def brute_force(groups, budget):
    """The optimal summed score over every combination within the budget (None if none)."""
    best = None
    for combo in itertools.product(*groups):
        if sum(c for _, c in combo) <= budget + 1e-12:
            score = sum(s for s, _ in combo)
            best = score if best is None else min(best, score)
    return best


def random_instance(rng):
    groups = [[(rng.random(), float(rng.randint(1, 16))) for _ in range(rng.randint(2, 3))]
              for _ in range(rng.randint(2, 6))]
    lo = sum(min(c for _, c in g) for g in groups)
    hi = sum(max(c for _, c in g) for g in groups)
    return groups, rng.uniform(lo, hi)


@pytest.mark.parametrize("seed", range(50))
def test_matches_brute_force(seed):
    groups, budget = random_instance(random.Random(seed))
    choice = solve(groups, budget)
    assert len(choice.picks) == len(groups)
    assert choice.cost == sum(groups[g][o][1] for g, o in enumerate(choice.picks))
    assert choice.cost <= budget
    assert abs(choice.score - brute_force(groups, budget)) < 1e-9


def test_infeasible_budget_names_minimum_cost():
    groups = [[(0.0, 16.0), (1.0, 4.0)], [(0.0, 8.0), (0.5, 6.0)]]
    with pytest.raises(BadInput, match="minimum achievable cost 10"):
        solve(groups, 9.5)


def test_budget_exactly_at_minimum_cost():
    groups = [[(0.0, 0.1), (1.0, 0.2)], [(0.3, 0.7), (0.0, 0.9)], [(2.0, 0.2), (0.0, 0.4)]]
    budget = 0.1 + 0.7 + 0.2  # float sum, not exactly 1.0: the tolerance must absorb it
    choice = solve(groups, budget)
    assert (choice.picks, choice.cost) == ([0, 0, 0], budget) and choice.score == pytest.approx(2.3)
    assert solve(groups, 1.0).picks == [0, 0, 0]


def test_large_instance_beats_greedy():
    rng = random.Random(0)
    formats = [(16.0, 0.0), (8.0, 1.0), (4.0, 4.0)]  # (cost per element, score scale)
    groups = []
    for _ in range(2000):
        n, sens = rng.randint(1, 100), rng.random()
        groups.append([(sens * k * rng.uniform(0.5, 1.5), n * bits) for bits, k in formats])
    budget = 0.5 * sum(g[0][1] for g in groups)  # an average of 8 bits
    choice = solve(groups, budget)
    assert choice.cost <= budget
    assert choice.score <= greedy(groups, budget)


def greedy(groups, budget):
    """Start at the cheapest option everywhere, then take the upgrades with the best score
    saved per unit of cost while they fit."""
    picks = [min(range(len(g)), key=lambda o: g[o][1]) for g in groups]
    cost = sum(g[o][1] for g, o in zip(groups, picks))
    moves = [((g[p][0] - s) / max(c - g[p][1], 1e-12), i, o) for i, (g, p) in enumerate(zip(groups, picks))
             for o, (s, c) in enumerate(g) if s < g[p][0] and c > g[p][1]]
    for _, i, o in sorted(moves, reverse=True):
        g, p = groups[i], picks[i]
        if g[o][0] < g[p][0] and cost + g[o][1] - g[p][1] <= budget:
            cost += g[o][1] - g[p][1]
            picks[i] = o
    return sum(g[o][0] for g, o in zip(groups, picks))
