"""The `stages.sft` block: schema, defaults, and cross checks that name the exact YAML path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from stagewise.recipe import RecipeError, load_recipe, select_stages

RECIPES = Path(__file__).resolve().parents[2] / "recipes"

# A small valid recipe with an sft block; tests break one field of it with --set.
GOOD = """\
name: t
seed: 7
data:
  world: {facts: 10, arithmetic: 10, stdlib_files: 0, retrieval: 0, noisy: 0}
  sources:
    - {name: facts, path: "@world/facts.jsonl"}
eval:
  chat: [world_chat_format]
stages:
  sft:
    data:
      world: {per_domain: 20, long_context: 2}
      sources:
        - {name: arithmetic, path: "@world/sft_arithmetic.jsonl"}
        - {name: sorting, path: "@world/sft_sorting.jsonl"}
        - {name: extra, path: extra.jsonl, domain: sorting}
    eval_suite: chat
    stages:
      - name: one
        tokens: 8192
        seq_length: 256
        global_batch: 4
        micro_batch: 2
        blend: {weights: {arithmetic: 2, sorting: 1}}
      - name: two
        normalization: conversation
        tokens: 8192
        seq_length: 512
        global_batch: 2
        micro_batch: 1
        blend: {weights: {sorting: 1}}
        keep_previous: 0.3
"""


@pytest.fixture
def recipe(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(GOOD))
    return path


def problems(path: Path, *overrides: str) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides)
    return info.value.problems


def line(needle: str) -> int:
    return next(i for i, text in enumerate(GOOD.splitlines(), 1) if needle in text)


def test_good_recipe_loads_with_defaults(recipe):
    sft = load_recipe(recipe).recipe.stages.sft
    one, two = sft.stages
    assert (one.name, one.normalization, one.seq_length, one.keep_previous, one.lora) == ("one", "token", 256, 0.0, None)
    assert (two.normalization, two.keep_previous, two.blend.weights) == ("conversation", 0.3, {"sorting": 1.0})
    assert sft.data.curate.max_reject_rate == 0.5 and sft.data.world.eval_fraction == 0.05
    assert [s.domain_name for s in sft.data.sources] == ["arithmetic", "sorting", "sorting"]
    assert select_stages(load_recipe(recipe).recipe, "sft") == ["sft"]


def test_tiny_recipe_has_two_sft_substages():
    r = load_recipe(RECIPES / "tiny.yaml").recipe
    one, two = r.stages.sft.stages
    assert (one.normalization, two.normalization) == ("token", "conversation")
    assert one.seq_length < two.seq_length and two.keep_previous > 0
    assert one.blend.reasoning_off_fraction > 0 and "long_context" in two.blend.weights
    assert r.stages.sft.eval_suite in r.eval and "world_chat_format" in r.eval[r.stages.sft.eval_suite]


def test_unknown_blend_domain_names_the_weight(recipe):
    got = problems(recipe, "stages.sft.stages[1].blend.weights={sortin: 1}")
    assert len(got) == 1
    assert got[0].startswith("stages.sft.stages[1].blend.weights.sortin: unknown domain 'sortin'; did you mean sorting?")
    assert "the sources' domains: arithmetic, sorting" in got[0]


def test_keep_previous_on_the_first_substage(recipe):
    got = problems(recipe, "stages.sft.stages[0].keep_previous=0.5")
    assert got == ["stages.sft.stages[0].keep_previous: the first sub-stage has no previous one to keep data from; "
                   "got 0.5 (--set stages.sft.stages[0].keep_previous=0.5)"]


def test_unknown_suites_at_stage_substage_and_gate(recipe):
    gate = "{suite: chatt, eval_every_tokens: 4096, all: [{metric: eval/sft_dev/loss, op: '<', value: 1}]}"
    got = problems(recipe, "stages.sft.eval_suite=cht", f"stages.sft.stages[1].gate={gate}",
                   "stages.sft.stages[0].eval_suite=nope")
    paths = sorted(p.split(":")[0] for p in got)
    assert paths == ["stages.sft.eval_suite", "stages.sft.stages[0].eval_suite", "stages.sft.stages[1].gate.suite"]
    assert any("unknown eval suite 'cht'; did you mean chat?" in p for p in got)


@pytest.mark.parametrize("metric, where", [("eval/sft_test/exact_match", "all"), ("rl/test/pass_at_1/all", "guards")])
def test_a_gate_on_a_test_metric_is_refused_naming_its_dev_twin(recipe, metric, where):
    """Gates decide, so they read dev: the test split is reported, never tuned on (eval/splits.py)."""
    rule = (f"all: [{{metric: {metric}, op: '>', value: 0.1}}]" if where == "all"
            else f"all: [{{metric: eval/sft_dev/loss, op: '<', value: 9}}], guards: [{{metric: {metric}, max_drop: 0.1}}]")
    got = problems(recipe, f"stages.sft.stages[1].gate={{suite: chat, eval_every_tokens: 4096, {rule}}}")
    dev = metric.replace("/test/", "/dev/").replace("_test/", "_dev/")
    assert got == [f"stages.sft.stages[1].gate: reads {metric!r}, a test-split metric: gates decide on dev ({dev!r}); "
                   f"test is reported, never tuned on (--set stages.sft.stages[1].gate={{suite: chat, "
                   f"eval_every_tokens: 4096, {rule}}})"]
    load_recipe(recipe, ["stages.sft.stages[1].gate={suite: chat, eval_every_tokens: 4096, "
                         "all: [{metric: eval/sft_dev/exact_match, op: '>', value: 0.1}]}"])  # dev: loads


def test_world_paths_checked(recipe):
    got = problems(recipe, "stages.sft.data.sources[0].path='@world/sft_eval.jsonl'",
                   "stages.sft.data.sources[1].path='@world/sft_sortng.jsonl'")
    assert got[0].startswith("stages.sft.data.sources[0].path: sft_eval.jsonl is the held-out set")
    assert got[1].startswith("stages.sft.data.sources[1].path: the SFT world writes no 'sft_sortng.jsonl'; "
                             "did you mean sft_sorting.jsonl?")
    got = problems(recipe, "stages.sft.data.world=null")
    assert [p.split(":")[0] for p in got] == ["stages.sft.data.sources[0].path", "stages.sft.data.sources[1].path"]
    assert "need a `world` block" in got[0]


def test_duplicates_and_schedule(recipe):
    got = problems(recipe, "stages.sft.stages[1].name=one", "stages.sft.data.sources[2].name=sorting",
                   "stages.sft.stages[0].schedule.warmup_tokens=9000")
    assert sorted(p.split(":")[0] for p in got) == ["stages.sft.data.sources[2].name", "stages.sft.stages[0].schedule.warmup_tokens",
                                                    "stages.sft.stages[1].name"]


def test_field_errors_name_their_path_and_line(recipe):
    got = problems(recipe, "stages.sft.stages[1].normalization=sequence")
    assert got[0].startswith("stages.sft.stages[1].normalization: must be 'token' or 'conversation'")
    got = problems(recipe, "stages.sft.stages=[]")
    assert got[0].startswith("stages.sft.stages: must have at least 1 item(s)")
    recipe.write_text(textwrap.dedent(GOOD).replace("blend: {weights: {sorting: 1}}", "blend: {weights: {sorting: -1}}"))
    got = problems(recipe)
    assert got == [f"stages.sft.stages[1].blend: blend weights must be >= 0, got {{'sorting': -1.0}} (r.yaml:{line('weights: {sorting: 1}')})"]


def test_lora_settings(recipe):
    r = load_recipe(recipe, ["stages.sft.stages[0].lora={r: 4, alpha: 8}"]).recipe
    assert r.stages.sft.stages[0].lora.r == 4 and "q_proj" in r.stages.sft.stages[0].lora.target_modules
    got = problems(recipe, "stages.sft.stages[0].lora={target_modules: [out_proj]}")
    assert got[0].startswith("stages.sft.stages[0].lora.target_modules: target_modules may not include 'out_proj'")


def test_sft_needs_a_start(recipe):
    from stagewise.flows.pipeline import check_starts

    r = load_recipe(recipe).recipe
    with pytest.raises(RecipeError, match="stages.sft needs a checkpoint to start from"):
        check_starts(r, ["sft"])
    r2 = load_recipe(recipe, ["model.from=/nonexistent/ckpt"]).recipe
    with pytest.raises(RecipeError, match="model.from: /nonexistent/ckpt is not a checkpoint directory"):
        check_starts(r2, ["sft"])


def test_relative_sources_of_a_base_in_another_folder_stay_relative_to_it(recipe, tmp_path):
    child_dir = tmp_path / "child"
    child_dir.mkdir()
    (child_dir / "c.yaml").write_text("base: ../r.yaml\nname: c\n")
    r = load_recipe(child_dir / "c.yaml").recipe
    assert r.stages.sft.data.sources[2].path == "../extra.jsonl"  # resolved next to c.yaml: the base's extra.jsonl
    assert r.stages.sft.data.sources[0].path == "@world/sft_arithmetic.jsonl"
