"""The on-policy block (RL and distillation's base): its step budget as the engine's token config."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from stagewise.model.runtime import Runtime
from stagewise.recipe import load_recipe

TINY = Path(__file__).resolve().parents[3] / "recipes" / "tiny.yaml"


def test_steps_train_config_counts_a_step_as_its_rows_of_the_longest_prompt_plus_the_response():
    rl = load_recipe(TINY, ["stages.rl.checkpoint_every_steps=2", "stages.rl.precision=auto"]).recipe.stages.rl
    prompts = {"a": SimpleNamespace(ids=[1] * 7), "b": SimpleNamespace(ids=[1] * 11)}
    cfg = rl.steps_train_config(prompts, Runtime(device="cpu", precision="fp32"))
    seq, rows = 11 + rl.rollout.max_new_tokens, rl.samples_per_step()
    assert (cfg.seq_length, cfg.global_batch) == (seq, rows)
    assert cfg.tokens == rl.steps * seq * rows and cfg.checkpoint_every_tokens == 2 * seq * rows
    assert rows % cfg.micro_batch == 0 and rl.micro_batch % cfg.micro_batch == 0
    assert cfg.precision == "fp32" and cfg.lb_loss_coeff == 0.0 and cfg.optimizer == rl.optimizer

    distill = load_recipe(TINY).recipe.stages.distill  # the same arithmetic on the distillation block
    assert distill.steps_train_config(prompts, Runtime()).tokens == distill.steps * \
        (11 + distill.rollout.max_new_tokens) * distill.samples_per_step()
