"""CurriculumSampler: the curriculum bound to a run (data/rl_sampler.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from stagewise.data.rl_curriculum import CurriculumConfig
from stagewise.data.rl_sampler import CurriculumSampler, domain_counts

PROMPTS = {"arith": [(f"a{i}", i / 40) for i in range(40)], "fmt": [(f"f{i}", (i % 8) / 8) for i in range(24)]}


def test_domain_counts_use_the_largest_remainder():
    assert domain_counts({"a": 1, "b": 1, "c": 1}, 16) == {"a": 6, "b": 5, "c": 5}
    assert domain_counts({"a": 3, "b": 1}, 10) == {"a": 8, "b": 2}  # 7.5 / 2.5: the tie goes to the first name


@pytest.mark.parametrize("cfg", [CurriculumConfig(), None])
def test_draws_depend_only_on_step_and_attempt_and_keep_domain_ratios(cfg):
    a = CurriculumSampler(PROMPTS, {"arith": 3, "fmt": 1}, 8, 20, cfg, seed=5)
    b = CurriculumSampler(PROMPTS, {"arith": 3, "fmt": 1}, 8, 20, cfg, seed=5)
    b.sample(3, 0)  # another draw first changes nothing: no RNG position to carry
    assert a.sample(7, 0) == b.sample(7, 0) and a.sample(7, 0) != a.sample(7, 1)
    for step in range(1, 21):
        picked = a.sample(step, 0)
        assert Counter(p[0] for p in picked) == {"a": 6, "f": 2}
        assert len(set(picked)) == len(picked)


def test_the_curriculum_moves_from_easy_to_hard():
    s = CurriculumSampler(PROMPTS, {"arith": 1}, 8, 20, CurriculumConfig(), seed=1)
    rate = dict(PROMPTS["arith"])
    mean = lambda step: sum(rate[i] for a in range(5) for i in s.sample(step, a)) / 40  # noqa: E731
    assert mean(1) > 0.7 and mean(20) < 0.3


def test_updated_pass_rates_survive_a_state_round_trip():
    s = CurriculumSampler(PROMPTS, {"arith": 1, "fmt": 1}, 8, 20, CurriculumConfig(), seed=1)
    s.update({"a0": 0.9, "f1": 0.0})
    t = CurriculumSampler(PROMPTS, {"arith": 1, "fmt": 1}, 8, 20, CurriculumConfig(), seed=1)
    t.load_state_dict(s.state_dict())
    assert dict(t.prompts["arith"])["a0"] == 0.9 and dict(t.prompts["fmt"])["f1"] == 0.0
    assert t.sample(4, 0) == s.sample(4, 0)


def test_a_domain_with_nothing_left_is_refused_by_name():
    with pytest.raises(ValueError, match="fmt"):
        CurriculumSampler({"arith": PROMPTS["arith"], "fmt": []}, {"arith": 1, "fmt": 1}, 8, 20, None, seed=1)
