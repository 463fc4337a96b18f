"""The recipe loader: shipped recipes, base inheritance, --set overrides, error texts, hashing."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from stagewise.recipe import (
    MLFLOW_PARAM_MAX,
    RecipeError,
    flatten_recipe,
    load_recipe,
    recipe_hash,
    select_stages,
)

RECIPES = Path(__file__).resolve().parents[2] / "recipes"

# A small valid recipe; tests edit one line of it to break it. Keep its lines stable.
GOOD = """\
name: t
seed: 7
data:
  world: {facts: 10, arithmetic: 10, stdlib_files: 0, retrieval: 0, noisy: 10}
  sources:
    - {name: facts, path: "@world/facts.jsonl", quality: high}
    - {name: arithmetic, path: "@world/arithmetic.jsonl"}
    - {name: noisy, path: "@world/noisy.jsonl", quality: low, max_epochs: 2}
stages:
  pretrain:
    tokens: 65536
    seq_length: 64
    global_batch: 8
    micro_batch: 4
    optimizer:
      lr: 1e-3
      min_lr: 1.0e-5
    phases:
      - name: diversity
        until: 0.8
        blend: {facts: 1, arithmetic: 1, noisy: 0.5}
      - name: quality
        until: 1.0
        blend: {facts: 2, arithmetic: 1}
"""


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line containing `needle`."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def error_of(path: Path, overrides=()) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides)
    return info.value


@pytest.fixture
def cwd(tmp_path, monkeypatch) -> Path:
    """Run inside tmp_path so error messages cite `r.yaml:N`."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --------------------------------------------------------------------------- shipped recipes

def test_tiny_recipe_loads():
    loaded = load_recipe(RECIPES / "tiny.yaml")
    r = loaded.recipe
    assert r.name == "tiny" and r.workdir == "runs/tiny"
    assert r.tokenizer.vocab_size == 4096 and r.model.preset == "tiny"
    pre = r.stages.pretrain
    assert 1_400_000 <= pre.tokens <= 1_600_000
    assert (pre.seq_length, pre.global_batch, pre.micro_batch) == (256, 16, 8)
    assert [(p.name, p.until) for p in pre.phases] == [("diversity", 0.8), ("quality", 1.0)]
    assert "noisy" in pre.phases[0].blend and "noisy" not in pre.phases[1].blend
    assert {s.name for s in r.data.sources} == {"stdlib", "facts", "arithmetic", "retrieval", "noisy"}
    assert r.data.world is not None
    assert pre.schedule.kind == "constant" and pre.schedule.warmup_tokens > 0  # the stable phase merges emulate decay


def test_nano_4b_recipe_inherits_from_tiny():
    loaded = load_recipe(RECIPES / "nemotron-3-nano-4b.yaml")
    r, pre = loaded.recipe, loaded.recipe.stages.pretrain
    assert r.name == "nemotron-3-nano-4b" and r.model.preset == "nemotron-3-nano-4b"
    assert pre.seq_length == 8192 and pre.optimizer.lr == 4.5e-4 and pre.optimizer.min_lr == 4.5e-6
    assert pre.phases[0].until == 0.94 and pre.schedule.decay_fraction == 0.2
    # data came from the base file, the geometry from the child
    assert loaded.sources["data.sources[0]"][0].endswith("tiny.yaml")
    assert loaded.sources["stages.pretrain.seq_length"][0].endswith("nemotron-3-nano-4b.yaml")
    assert "base" not in loaded.raw


# --------------------------------------------------------------------------- base inheritance

def test_base_deep_merges_mappings_and_replaces_lists(tmp_path):
    write(tmp_path, GOOD, "base.yaml")
    child = write(tmp_path, """\
        base: base.yaml
        name: child
        data:
          sources:
            - {name: facts, path: "@world/facts.jsonl"}
        stages:
          pretrain:
            optimizer: {lr: 5.0e-4}
            phases:
              - {name: only, until: 1.0, blend: {facts: 1}}
    """)
    loaded = load_recipe(child)
    r = loaded.recipe
    assert r.name == "child" and r.seed == 7
    assert [s.name for s in r.data.sources] == ["facts"]          # list replaced whole
    assert r.data.world.facts == 10                                # sibling key kept
    assert r.stages.pretrain.optimizer.lr == 5e-4                  # deep merge ...
    assert r.stages.pretrain.optimizer.min_lr == 1e-5              # ... keeps the base's keys
    assert loaded.sources["stages.pretrain.optimizer.min_lr"] == (str(tmp_path / "base.yaml"), line_of(GOOD, "min_lr"))
    assert loaded.sources["stages.pretrain.optimizer.lr"][0] == str(child)
    assert "data.sources[2]" not in loaded.sources                 # the base's list is gone


def test_base_cycle_is_an_error(tmp_path, cwd):
    write(tmp_path, "base: b.yaml\nname: a\n", "a.yaml")
    write(tmp_path, "base: a.yaml\nname: b\n", "b.yaml")
    assert str(error_of(tmp_path / "a.yaml")) == "base: inheritance cycle: a.yaml -> b.yaml -> a.yaml"


def test_missing_base_names_the_line(tmp_path, cwd):
    path = write(tmp_path, "name: x\nbase: nope.yaml\n")
    assert str(error_of(path)) == "base: file not found: nope.yaml (r.yaml:2)"


def test_relative_source_path_from_a_base_in_another_folder(tmp_path):
    (tmp_path / "common").mkdir()
    write(tmp_path, GOOD.replace('"@world/facts.jsonl"', "corpus/facts.jsonl"), "common/base.yaml")
    child = write(tmp_path, "base: common/base.yaml\nname: c\n")
    assert load_recipe(child).recipe.data.sources[0].path == "common/corpus/facts.jsonl"


# --------------------------------------------------------------------------- --set

def test_overrides_scalars_lists_and_indices(tmp_path):
    path = write(tmp_path, GOOD)
    loaded = load_recipe(path, [
        "stages.pretrain.tokens=131072",
        "stages.pretrain.optimizer.lr=3e-4",
        "stages.pretrain.optimizer.betas=[0.9, 0.99]",
        "stages.pretrain.phases[0].until=0.6",
        "stages.pretrain.phases[-1].blend={facts: 1}",
        "stages.pretrain.schedule.kind=cosine",        # a block the file does not have
        "tokenizer.train_sources=[facts,noisy]",
        "model.overrides.hidden_size=64",               # free-form mapping
    ])
    pre = loaded.recipe.stages.pretrain
    assert pre.tokens == 131072 and pre.optimizer.lr == 3e-4 and pre.optimizer.betas == (0.9, 0.99)
    assert pre.phases[0].until == 0.6 and pre.phases[1].blend == {"facts": 1.0}
    assert pre.schedule.kind == "cosine" and loaded.recipe.tokenizer.train_sources == ["facts", "noisy"]
    assert loaded.recipe.model.overrides == {"hidden_size": 64}
    assert loaded.sources["stages.pretrain.phases[1].blend"] == ("--set stages.pretrain.phases[-1].blend={facts: 1}", 0)


def test_override_of_unknown_path_suggests_the_nearest_key(tmp_path, cwd):
    path = write(tmp_path, GOOD)
    err = error_of(path, ["stages.pretrain.seq_lenght=128", "stages.pretrain.phases[5].until=0.5", "nokey"])
    assert err.problems == [
        "stages.pretrain.seq_lenght: unknown key; did you mean seq_length? (--set stages.pretrain.seq_lenght=128)",
        "stages.pretrain.phases[5]: index out of range; stages.pretrain.phases has 2 item(s) "
        "(--set stages.pretrain.phases[5].until=0.5)",
        "--set nokey: expected key=value, e.g. stages.pretrain.tokens=500000",
    ]


# --------------------------------------------------------------------------- error texts

@pytest.mark.parametrize("old, new, expected", [
    ("micro_batch: 4", "micro_batch: 0", "stages.pretrain.micro_batch: must be > 0 (r.yaml:{line})"),
    ("seq_length: 64", "seq_lenght: 64", "stages.pretrain.seq_lenght: unknown key; did you mean seq_length? (r.yaml:{line})"),
    ("blend: {facts: 2, arithmetic: 1}", "blend: {facts: 2, webtext: 1}",
     "stages.pretrain.phases[1].blend: unknown source 'webtext'; known: arithmetic, facts, noisy (r.yaml:{line})"),
    ("until: 0.8", "until: 1.0",
     "stages.pretrain.phases[1].until: must be greater than the previous phase's until (1.0); got 1.0 (r.yaml:{last})"),
    ("global_batch: 8", "global_batch: 6",
     "stages.pretrain.global_batch: global_batch (6) must be a multiple of micro_batch (4) (r.yaml:{line})"),
    ("quality: high}", "quality: great}",
     "data.sources[0].quality: must be 'high', 'medium' or 'low'; got 'great' (r.yaml:{line})"),
    ("  pretrain:", "  quantize:\n    effective_bitz: 5\n  pretrain:",
     "stages.quantize.effective_bitz: unknown key; did you mean effective_bits? (r.yaml:{next})"),
    ("seed: 7", "seed: 7\nmodel: {preset: tinyy}",
     "model.preset: unknown preset 'tinyy'; did you mean tiny? (r.yaml:{next})"),
])
def test_bad_value_names_path_file_and_line(tmp_path, cwd, old, new, expected):
    text = GOOD.replace(old, new)
    assert text != GOOD
    err = error_of(write(tmp_path, text))
    line = line_of(text, new.splitlines()[0])
    last = max(i for i, text_line in enumerate(text.splitlines(), 1) if new.splitlines()[0] in text_line)
    want = expected.format(line=line, next=line + 1, last=last)
    if "unknown preset" in want:  # the list of presets follows; check the start
        assert err.problems[0].startswith(want.split(" (r.yaml")[0]) and err.problems[0].endswith(f"(r.yaml:{line + 1})")
    else:
        assert err.problems == [want]
    assert str(err).startswith("invalid recipe r.yaml (1 problem):\n  ")


def test_every_problem_is_listed_without_pydantic_noise(tmp_path, cwd):
    text = GOOD.replace("micro_batch: 4", "micro_batch: -1").replace("seq_length: 64", "seq_lenght: 64")
    text = text.replace("blend: {facts: 2, arithmetic: 1}", "blend: {facts: 2, web: 1}").replace("name: t", "name: t t")
    err = error_of(write(tmp_path, text))
    msg = str(err)
    assert msg.splitlines()[0] == "invalid recipe r.yaml (4 problems):"
    for path in ("name:", "stages.pretrain.micro_batch:", "stages.pretrain.seq_lenght:", "stages.pretrain.phases[1].blend:"):
        assert f"  {path}" in msg
    for noise in ("pydantic", "http", "Input should", "Traceback", "Value error"):
        assert noise not in msg


def test_missing_required_field_and_last_phase(tmp_path, cwd):
    text = GOOD.replace("    tokens: 65536\n", "").replace("until: 1.0", "until: 0.9")
    err = error_of(write(tmp_path, text))
    assert "stages.pretrain.tokens: required; add it to the recipe (r.yaml:10)" in err.problems
    assert f"stages.pretrain.phases[1].until: the last phase must end at 1.0; got 0.9 (r.yaml:{line_of(text, 'until: 0.9')})" in err.problems


def test_yaml_syntax_and_duplicate_keys(tmp_path, cwd):
    assert str(error_of(write(tmp_path, "name: x\ndata: [\n"))).startswith("r.yaml:3: invalid YAML")
    err = error_of(write(tmp_path, "name: x\nseed: 1\nseed: 2\n"))
    assert err.problems == ["seed: duplicate key (r.yaml:3)"]


def test_missing_file():
    assert "recipe file not found" in str(error_of(Path("/nonexistent/r.yaml")))


def test_workdir_interpolation(tmp_path, cwd):
    path = write(tmp_path, GOOD + "workdir: out/${name}-${seed}\n")
    assert load_recipe(path).recipe.workdir == "out/t-7"
    err = error_of(path, ["workdir=out/${user}"])
    assert err.problems == ["workdir: unknown variable ${user}; only ${name} and ${seed} are replaced (--set workdir=out/${user})"]


def test_select_stages(tmp_path):
    r = load_recipe(write(tmp_path, GOOD)).recipe
    assert select_stages(r, None) is None and select_stages(r, "pretrain") == ["pretrain"]
    with pytest.raises(RecipeError, match="the recipe has no stages.quantize block"):
        select_stages(r, "pretrain,quantize")
    with pytest.raises(RecipeError, match="did you mean pretrain"):
        select_stages(r, "pretrian")


# --------------------------------------------------------------------------- hash and params

def test_hash_ignores_formatting_but_not_values(tmp_path):
    h = recipe_hash(load_recipe(write(tmp_path, GOOD)).recipe)
    assert len(h) == 16 and int(h, 16) >= 0
    reformatted = "# a comment\n" + GOOD.replace("seed: 7", "seed:   7   # why not").replace(
        "      lr: 1e-3\n      min_lr: 1.0e-5\n", "      min_lr: 0.00001   # key order and spelling\n      lr: 0.001\n"
    ).replace("{facts: 2, arithmetic: 1}", "\n          facts: 2\n          arithmetic: 1")
    assert reformatted.count("\n") > GOOD.count("\n") + 2
    assert recipe_hash(load_recipe(write(tmp_path, reformatted, "r2.yaml")).recipe) == h
    # the same recipe split over a base file and an override hashes the same
    write(tmp_path, GOOD, "base.yaml")
    split = write(tmp_path, "base: base.yaml\n", "child.yaml")
    assert recipe_hash(load_recipe(split).recipe) == h
    assert recipe_hash(load_recipe(split, ["stages.pretrain.optimizer.lr=2e-3"]).recipe) != h
    assert recipe_hash(load_recipe(split, ["seed=8"]).recipe) != h


def test_flatten_recipe_for_mlflow(tmp_path):
    path = write(tmp_path, GOOD)
    flat = flatten_recipe(load_recipe(path, ["model.overrides.hybrid_override_pattern=" + "M" * 7000]).recipe)
    assert flat["stages.pretrain.tokens"] == "65536"
    assert flat["stages.pretrain.phases.1.blend.facts"] == "2.0"
    assert json.loads(flat["stages.pretrain.optimizer.betas"]) == [0.9, 0.95]
    assert flat["data.sources.0.path"] == "@world/facts.jsonl"
    assert len(flat["model.overrides.hybrid_override_pattern"]) == MLFLOW_PARAM_MAX
    assert all("[" not in k for k in flat) and all(isinstance(v, str) for v in flat.values())


def test_merge_needs_intermediate_checkpoints():
    from stagewise.recipe import RecipeError, load_recipe

    with pytest.raises(RecipeError) as err:
        load_recipe(RECIPES / "tiny.yaml", ["stages.pretrain.checkpoint_every_tokens=null"])
    assert "stages.pretrain.checkpoint_every_tokens: must be set when stages.merge is" in str(err.value)


def test_merge_window_longer_than_kept_checkpoints_is_named():
    from stagewise.recipe import RecipeError, load_recipe

    with pytest.raises(RecipeError) as err:
        load_recipe(RECIPES / "tiny.yaml", ["stages.pretrain.keep_checkpoints=2"])
    assert "stages.merge.windows_tokens[0]: window of 368640 tokens is longer than the 245760 tokens" in str(err.value)
