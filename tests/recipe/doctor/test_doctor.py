"""The recipe doctor: each rule fires on a recipe made to break it, stays quiet on the shipped ones,
names the field with its file:line, and reads logged metric names from the code that logs them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from stagewise.recipe import load_recipe
from stagewise.recipe.doctor import diagnose, summary
from stagewise.recipe.doctor.training_rules import scaled_sft_lr

RECIPES = Path(__file__).resolve().parents[3] / "recipes"
TINY = RECIPES / "tiny.yaml"
NANO = RECIPES / "nemotron-3-nano-4b.yaml"
FINETUNE = RECIPES / "finetune.yaml"


def check(tmp_path: Path, *sets: str, recipe: Path = TINY) -> list:
    """The findings on a recipe with overrides, its workdir empty (no prepared data) unless a test fills it."""
    return diagnose(load_recipe(recipe, [f"workdir={tmp_path / 'work'}", *sets]))


def only(findings: list, rule: str) -> list:
    return [f for f in findings if f.rule == rule]


# --------------------------------------------------------------------------- shipped recipes


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_recipe_is_quiet(recipe, tmp_path):
    assert check(tmp_path, recipe=recipe) == []
    assert diagnose(load_recipe(recipe)) == []  # with the workdir's prepared data too, when there is some


# --------------------------------------------------------------------------- prepared data (a manifest)


def prepared(tmp_path: Path, train_tokens: dict[str, int], *sets: str) -> None:
    """Prepared data as data/prepare.py leaves it: the demo world where it goes, a manifest under the digest."""
    from stagewise.data.digest import digest_of, prepare_inputs
    from stagewise.data.prepare import world_path

    loaded = load_recipe(TINY, [f"workdir={tmp_path / 'work'}", *sets])
    r = loaded.recipe
    world = world_path(r.data.world, r.seed, tmp_path / "work")
    world.mkdir(parents=True)
    for s in r.data.sources:
        (world / Path(s.path).name).write_text('{"text": "x"}\n')
    digest = digest_of(prepare_inputs(r.data, r.tokenizer, r.seed, loaded.base_dir, world))
    root = tmp_path / "work" / "data" / digest[:16]
    root.mkdir(parents=True)
    sources = {n: {"train": "t", "val": "v", "train_tokens": t, "val_tokens": 0, "docs": 1} for n, t in train_tokens.items()}
    (root / "manifest.json").write_text(json.dumps({"digest": digest, "tokenizer_dir": "tokenizer", "vocab_size": 4096,
                                                    "sources": sources}))


TINY_SOURCES = ("stdlib", "facts", "arithmetic", "retrieval", "noisy")


def test_warmup_larger_than_a_tenth_of_the_dataset_is_flagged(tmp_path):
    prepared(tmp_path, {n: 100_000 for n in TINY_SOURCES})  # 500k tokens; warmup 73,728 = 15%
    [f] = only(check(tmp_path), "warmup")
    assert f.field == "stages.pretrain.schedule.warmup_tokens" and f.severity == "warning"
    assert f.value == pytest.approx(73_728 / 500_000, abs=1e-4) and "prepared dataset" in f.message


def test_a_source_read_too_often_is_an_error_and_the_cap_a_warning(tmp_path):
    # stdlib: pretraining 0.30 x 0.8 x 1,474,560 + 0.35 x 0.2 x 1,474,560 = 457,114 tokens, long context
    # 0.35 of its 79% phase-2 share of 196,608 = 54,362: 511,476 tokens asked of 10,000
    prepared(tmp_path, {"stdlib": 10_000, **{n: 10_000_000 for n in TINY_SOURCES[1:]}})
    [f] = only(check(tmp_path), "epochs")
    assert (f.field, f.severity) == ("data.sources[0]", "error") and f.value == pytest.approx(51.15, abs=0.01)
    assert "its max_epochs (4) retires it" in f.message
    loaded = load_recipe(TINY, [f"workdir={tmp_path / 'work'}"])
    [alone] = only(diagnose(loaded, ["pretrain"]), "epochs")  # long context does not run: 457,114 tokens
    assert alone.value == pytest.approx(45.71, abs=0.01)


def test_epochs_between_4_and_8_warn_and_a_high_cap_warns_without_data(tmp_path):
    prepared(tmp_path, {"facts": 70_000, **{n: 10_000_000 for n in TINY_SOURCES if n != "facts"}})
    [f] = only(check(tmp_path), "epochs")  # facts: 0.25 x 0.8 x T + 0.35 x 0.2 x T (T = 1,474,560) + 54,362 -> 6.46
    assert f.severity == "warning" and f.value == pytest.approx(6.46, abs=0.01) and f.field == "data.sources[1]"
    [cap] = only(check(tmp_path / "other", "data.sources[2].max_epochs=12"), "epochs")
    assert cap.field == "data.sources[2].max_epochs" and cap.value == 12


def test_a_manifest_of_other_settings_is_not_read(tmp_path):
    prepared(tmp_path, {n: 1_000 for n in TINY_SOURCES}, "seed=7")  # prepared for another seed
    assert check(tmp_path) == []


# --------------------------------------------------------------------------- the rules on broken recipes


def test_warmup_spanning_a_fine_tune_or_pretraining(tmp_path):
    [f] = only(check(tmp_path, "stages.sft.stages[1].schedule.warmup_tokens=40960"), "warmup")
    assert (f.field, f.severity, f.value, f.stage) == ("stages.sft.stages[1].schedule.warmup_tokens", "warning", 0.625, "sft")
    assert "40,960 tokens (5 steps) is 62%" in f.message
    [p] = only(check(tmp_path, "stages.pretrain.tokens=163840"), "warmup")
    assert p.field == "stages.pretrain.schedule.warmup_tokens" and p.value == pytest.approx(0.45)


def test_scaled_sft_lr_by_hand():
    assert scaled_sft_lr(120.6e9) == pytest.approx(1e-5)
    assert scaled_sft_lr(2_122_944) == pytest.approx(1e-5 * (120.6e9 / 2_122_944) ** 0.5)  # 2.38e-3: tiny
    assert scaled_sft_lr(3_973_556_832) == pytest.approx(5.51e-5, rel=1e-3)


def test_fine_tune_lr_at_the_pretraining_peak_is_an_error(tmp_path):
    found = only(check(tmp_path, "stages.sft.stages[0].optimizer.lr=3e-3", "stages.rl.optimizer.lr=4e-3",
                       "stages.long_context.optimizer.lr=3e-3"), "finetune-lr")
    assert [(f.field, f.severity) for f in found] == [("stages.sft.stages[0].optimizer.lr", "error"),
                                                      ("stages.rl.optimizer.lr", "error"),
                                                      ("stages.long_context.optimizer.lr", "error")]
    assert "1x the pretraining peak (3.0e-03)" in found[0].message


def test_fine_tune_lr_is_judged_by_the_models_size(tmp_path):
    # 3e-4 is a tenth of tiny's pretraining peak and fine for ~2M parameters, 5.4x the 4B model's scaled LR
    [f] = only(check(tmp_path, "stages.rl.optimizer.lr=3e-4", recipe=NANO), "finetune-lr")
    assert (f.field, f.severity) == ("stages.rl.optimizer.lr", "warning") and "5.4x" in f.message
    assert only(check(tmp_path, "stages.rl.optimizer.lr=3e-4"), "finetune-lr") == []
    lora = "stages.sft.stages[0].lora={r: 8}"  # LoRA allows 20x: 3e-4 on the 4B model is fine with adapters
    assert only(check(tmp_path, lora, "stages.sft.stages[0].optimizer.lr=3e-4", recipe=NANO), "finetune-lr") == []
    assert only(check(tmp_path, "stages.sft.stages[0].optimizer.lr=3e-4", recipe=NANO), "finetune-lr")


def test_moe_fine_tuned_on_one_domain(tmp_path):
    narrow = "stages.sft.stages[0].blend.weights={arithmetic: 20, format: 1}"
    [f] = only(check(tmp_path, narrow), "moe-narrow-blend")
    assert f.field == "stages.sft.stages[0].blend.weights.arithmetic" and f.value == pytest.approx(20 / 21, abs=1e-4)
    dense = "model.overrides.hybrid_override_pattern=M*-M--"  # no expert layer: no collapse to fear
    assert only(check(tmp_path, narrow, dense), "moe-narrow-blend") == []


def test_the_finetune_recipe_on_its_domain_alone_is_a_narrow_moe_blend(tmp_path, tiny_checkpoint):
    """finetune.yaml as shipped takes a slice of every demo domain (my_domain 2.4 of 12: 20%); its one-domain
    variant fires the rule. The model is the checkpoint's (tiny: 8 routed experts, 300 tokens, fewer than the
    inherited tokenizer.vocab_size of 4096, which sizes a trained BPE and must not hide the model's facts)."""
    start = f"model.from={tiny_checkpoint}"
    assert check(tmp_path, start, recipe=FINETUNE) == []
    alone = "stages.sft.stages[0].blend.weights={my_domain: 1}"
    [f] = only(check(tmp_path, start, alone, recipe=FINETUNE), "moe-narrow-blend")
    assert (f.field, f.severity, f.value, f.stage) == ("stages.sft.stages[0].blend.weights.my_domain", "warning", 1.0, "sft")
    assert "'my_domain' carries 100% of the blend" in f.message and "others here: (none)" in f.message
    assert f.where == f"--set {alone}"  # the variant came from the command line
    # the shipped placeholder (/path/to/post-trained-checkpoint) builds no model: the rule cannot know it is an MoE
    assert only(check(tmp_path, alone, recipe=FINETUNE), "moe-narrow-blend") == []


def test_long_context_without_short_sequences(tmp_path):
    [f] = only(check(tmp_path, "stages.long_context.data.lengths=[{length: 1024, share: 1}]"), "long-context-mix")
    assert f.field == "stages.long_context.data.lengths" and f.value == 1024 and "256" in f.message


def test_sft_stage_two_or_long_packs_without_conversation_normalisation(tmp_path):
    [f] = only(check(tmp_path, "stages.sft.stages[1].normalization=token"), "sft-normalization")
    assert f.field == "stages.sft.stages[1].normalization" and "later sub-stage" in f.message
    [g] = only(check(tmp_path, "stages.sft.stages[0].seq_length=1024"), "sft-normalization")  # 4 x 256
    assert g.field == "stages.sft.stages[0].normalization" and "packs of 1,024 tokens" in g.message


def test_rl_without_a_difficulty_filter(tmp_path):
    for sets in (["stages.rl.filter=null"], ["stages.rl.filter.drop_solved=false"]):
        [f] = only(check(tmp_path, *sets), "rl-filter")
        assert f.field == "stages.rl.filter" and f.severity == "warning"


def test_quantizing_the_output_layer_or_qkv(tmp_path):
    found = only(check(tmp_path, "stages.quantize.pins=[{pattern: lm_head, format: nvfp4}]",
                       "stages.quantize.keep_bf16=[lm_head]"), "quantize-sensitive")
    assert [(f.field, f.severity, f.value) for f in found] == [("stages.quantize.pins[0]", "error", 1),
                                                              ("stages.quantize.keep_bf16", "warning", 3)]
    assert "attention Q/K/V" in found[1].message
    # the Ultra heuristic keeps them BF16 without keep_bf16; a pin that matches nothing would stop the stage
    assert only(check(tmp_path, "stages.quantize.preset=ultra", "stages.quantize.keep_bf16=[]"), "quantize-sensitive") == []
    [bad] = only(check(tmp_path, "stages.quantize.pins=[{pattern: '*.nothing', format: fp8}]"), "quantize-sensitive")
    assert bad.severity == "error" and "matches no quantizable operator" in bad.message


GATE = "{{suite: chat, eval_every_tokens: 40960, all: [{conds}], guards: [{{metric: {guard}, max_drop: 0.1}}]}}"


def test_gate_metrics_no_evaluation_logs(tmp_path):
    conds = ("{metric: eval/validaton/loss, op: '<', value: 3}, {metric: train/lm_loss, op: '<', value: 9}, "
             "{metric: eval/world_sorting/exact_match, op: '>', value: 0.1}")
    gate = GATE.format(conds=conds, guard="eval/world_arithmetic/acc")
    found = only(check(tmp_path, f"stages.pretrain.gate={gate}"), "gate-metric")
    assert [f.field for f in found] == ["stages.pretrain.gate.all[0].metric", "stages.pretrain.gate.guards[0].metric"]
    assert "did you mean eval/validation/loss?" in found[0].message and found[1].severity == "error"


def test_sft_gates_know_the_held_out_names_and_skip_standard_tasks(tmp_path):
    conds = "{metric: eval/sft_dev/exact_match_arithmetic, op: '>', value: 0.1}, {metric: eval/hellaswag/acc, op: '>', value: 0}"
    gate = GATE.format(conds=conds, guard="eval/validation/loss").replace("suite: chat", "suite: std")
    hs = tmp_path / "hellaswag"  # a standard task runs on the team's own files (eval/standard_tasks.py)
    hs.mkdir()
    (hs / "validation.jsonl").write_text('{"ctx_a": "A", "ctx_b": "b", "activity_label": "L", "endings": ["x"], "label": "0"}\n')
    [f] = only(check(tmp_path, f"eval.std=[hellaswag@{hs}]", f"stages.sft.stages[0].gate={gate}"), "gate-metric")
    assert f.field == "stages.sft.stages[0].gate.guards[0].metric"  # SFT scores held-out conversations, not validation


# --------------------------------------------------------------------------- where, stages, JSON


def test_findings_cite_the_line_of_a_child_recipe_and_filter_by_stage(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {TINY}\nname: child\nworkdir: {tmp_path / 'w'}\nstages:\n  rl:\n    filter: null\n")
    loaded = load_recipe(child)
    [f] = diagnose(loaded)
    assert (f.rule, f.where) == ("rl-filter", f"{child}:6")
    assert diagnose(loaded, ["pretrain", "sft"]) == [] and diagnose(loaded, ["rl"]) == [f]
    assert set(summary([f])["findings"][0]) == {"rule", "severity", "field", "where", "message", "value", "reference"}


# --------------------------------------------------------------------------- logged names, from the code


def test_validation_names_are_what_validation_loss_returns():
    from stagewise.eval.metric_names import UNIGRAM_BASELINE, validation_metric_names
    from stagewise.eval.validation import validation_loss

    class Uniform(torch.nn.Module):
        def forward(self, input_ids):
            return SimpleNamespace(logits=torch.zeros(*input_ids.shape, 8))

    out = validation_loss(Uniform(), {"a": np.arange(40) % 8, "b": np.arange(40) % 8}, seq_length=8, max_tokens=64)
    assert sorted([*out, UNIGRAM_BASELINE]) == sorted(validation_metric_names(["a", "b"]))


def test_held_out_names_are_what_heldout_answers_returns(monkeypatch):
    import stagewise.eval.heldout as heldout
    from stagewise.eval.metric_names import heldout_metric_names

    class Tok:
        def apply_chat_template(self, prefix, **kw):
            return prefix[-1]["content"]

        def __call__(self, text, **kw):
            return SimpleNamespace(input_ids=[1] * len(text))

    convs = [{"domain": d, "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
             for d in ("arithmetic", "lookup")]
    monkeypatch.setattr(heldout, "_generate", lambda model, tok, prompts, n, device: ["a"] * len(prompts))
    results = heldout.answer_results(torch.nn.Linear(1, 1), Tok(), convs)
    out = heldout.answer_metrics(results) | heldout.answer_intervals(results)  # what heldout_task logs
    assert set(out) | {"loss", "supervised_tokens"} == set(heldout_metric_names(["arithmetic", "lookup"]))
    assert out["exact_match_low"] < out["exact_match"] == 1.0 == out["exact_match_high"]  # 2 of 2: Wilson


def test_local_task_names_are_what_headline_metrics_reports():
    from stagewise.eval.harness import headline_metrics, local_metric_names

    lm_eval_results = {"world_arithmetic": {"exact_match,strip": 0.5, "exact_match_stderr,strip": 0.1, "alias": "x"},
                       "world_compare_mc": {"acc,none": 0.5, "acc_norm,none": 0.4}}
    names, outside = local_metric_names(["world_arithmetic", "world_compare_mc", "mmlu"])
    assert set(headline_metrics(lm_eval_results)) == names and outside == ["mmlu"]
    assert local_metric_names(["world"])[0] >= names  # a tag stands for its tasks
