"""A held-out evaluation sampled by a bf16 sampler (rollout.sampler_precision: bf16) is its own cached
step: it never reads, nor is read as, the scores of the same weights sampled at the trainer's precision."""

from __future__ import annotations

from types import SimpleNamespace

from stagewise.eval.rl_scoring import HELDOUT_KIND, heldout_spec
from stagewise.eval.score_memo import ScoreMemo


class HFGenerator:  # named as the real one: the cache keys on the generator's class name
    def __init__(self, precision: str | None):
        if precision is not None:
            self.precision = precision


def test_the_sampler_precision_keys_the_held_out_scores(tmp_path):
    row = SimpleNamespace(model_dump=lambda mode: {"expected_answer": 4})
    wiring = SimpleNamespace(prompts={"a": SimpleNamespace(ids=(5, 6))},
                             rows={"a": SimpleNamespace(environment="exact_answer", row=row)})
    path = lambda gen: ScoreMemo(tmp_path).path(HELDOUT_KIND, heldout_spec("sha", gen, wiring, ["a"], [8, 11, 1.0, 0]))  # noqa: E731
    assert path(HFGenerator("bf16")) != path(HFGenerator("trainer"))
    assert path(HFGenerator("trainer")) == path(HFGenerator(None))  # as cached before the setting existed
