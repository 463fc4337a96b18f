"""The operator's boundary for form input (recipe/form_policy.py): which override keys and which
recipe files a served flow admits, checked in the flow body before any work. A real Prefect server
runs the same checks in tests/e2e/test_deployments.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stagewise.data.errors import BadInput
from stagewise.flows.data_build import data_build_flow
from stagewise.flows.deployed import ablate_recipe_flow, run_recipe_flow
from stagewise.recipe.form_policy import (
    DEFAULT_ALLOWED,
    POLICY_ENV,
    FormPolicy,
    form_policy,
    serving_policy,
    shipped_root,
)

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"
OPEN_BY_DEFAULT = ["seed=3", "stages.pretrain.tokens=32768", "stages.rl.steps=4", "stages.long_context.optimizer.lr=1e-3",
                   "stages.sft.stages[1].optimizer.min_lr=1e-5", "stages.sft.stages[0].tokens=4096",
                   "stages.pretrain.phases[0].blend={stdlib: 1}", "stages.pretrain.phases[1].blend.facts=0.5",
                   "stages.sft.stages[0].blend.weights.format=2", " stages.pretrain.tokens =1"]
CLOSED_BY_DEFAULT = {
    "stages.pretrain.launch={env: {image: evil/image}}": "stages.pretrain.launch",
    "stages.pretrain.launch.env.venv=/tmp/evil": "stages.pretrain.launch.env.venv",
    "stages.pretrain.launch.slurm.container_mounts=[/:/host]": "stages.pretrain.launch.slurm.container_mounts",
    "tracking.uri=http://outside.example:5000": "tracking.uri",
    "workdir=/srv/other-team": "workdir",
    "base=/etc/passwd": "base",
    "model.from=/home/someone/checkpoint": "model.from",
    "data.sources[0].path=/etc/shadow": "data.sources[0].path",
    "stages.sft.data.sources[0].path=/etc/shadow": "stages.sft.data.sources[0].path",
    "stages.pretrain={tokens: 1}": "stages.pretrain",  # a whole block would carry its launch
    "stages.pretrain.optimizer={lr: 1}": "stages.pretrain.optimizer",
    "stages . pretrain . launch = x": "stages . pretrain . launch",  # a key no pattern names is closed
    "stages.sft.stages[0].launch.env.image=x": "stages.sft.stages[0].launch.env.image",
}


def test_the_default_opens_the_training_knobs_only():
    policy = FormPolicy()
    policy.admit_overrides(OPEN_BY_DEFAULT)
    for text, key in CLOSED_BY_DEFAULT.items():
        with pytest.raises(BadInput) as err:
            policy.admit_overrides(["seed=1", text])
        assert f"overrides: {key} may not be set from a form" in str(err.value), text
        assert str(err.value).count("may not be set") == 1  # the allowed one is not named
    with pytest.raises(BadInput, match="'novalue' is not key=value"):
        policy.admit_overrides(["novalue"])


def test_a_star_is_one_segment_and_two_stars_anything():
    policy = FormPolicy(allowed=["stages.*.tokens", "workdir", "stages.sft.**"])
    assert policy.allows("stages.pretrain.tokens") and policy.allows("workdir")
    assert not FormPolicy(allowed=["stages.*.tokens"]).allows("stages.sft.stages[0].tokens")
    assert policy.allows("stages.sft.stages[0].tokens")  # via stages.sft.**
    assert not policy.allows("stages.rl.stages[0].tokens") and not policy.allows("stages.pretrain.launch.tokens")
    assert not policy.allows("workdirs") and not policy.allows("xworkdir")
    assert policy.allows("stages.sft.stages[0].launch.env.image")  # what the operator opened, it opened
    assert FormPolicy(allowed=["**"]).allows("base")


def test_recipes_outside_the_roots_are_refused_symlinks_resolved(tmp_path):
    served, other = tmp_path / "served", tmp_path / "other"
    served.mkdir(), other.mkdir()
    (served / "mine.yaml").write_text("name: x\n")
    (other / "theirs.yaml").write_text("name: y\n")
    (served / "link.yaml").symlink_to(other / "theirs.yaml")
    policy = serving_policy(served / "mine.yaml")
    assert policy.recipe_roots == [str(served.resolve()), str(shipped_root())]
    assert policy.admit_file(str(served / "mine.yaml"), "recipe") == (served / "mine.yaml").resolve()
    assert policy.admit_file("tiny", "recipe") == shipped_root() / "tiny.yaml"  # a shipped name
    for outside in (other / "theirs.yaml", served / "link.yaml", served / ".." / "other" / "theirs.yaml"):
        with pytest.raises(BadInput, match=r"recipe: .*theirs.yaml is outside the directories"):
            policy.admit_file(str(outside), "recipe")
    widened = serving_policy(served / "mine.yaml", roots=[other])
    assert widened.admit_file(str(served / "link.yaml"), "recipe") == (other / "theirs.yaml").resolve()


def test_serve_refuses_a_bad_pattern_or_root(tmp_path):
    with pytest.raises(BadInput, match="--allow-set 'a;b'"):
        serving_policy(TINY, allow=["a;b"])
    with pytest.raises(BadInput, match="--recipe-root .*: not a directory"):
        serving_policy(TINY, roots=[tmp_path / "missing"])
    assert serving_policy(TINY, allow=["workdir"]).allowed == [*DEFAULT_ALLOWED, "workdir"]


def test_a_promotion_may_name_only_the_served_store():
    policy = FormPolicy(tracking_uris=["sqlite:////runs/tiny/mlflow.db"])
    policy.admit_tracking("sqlite:////runs/tiny/mlflow.db")
    policy.admit_tracking(None)  # the default store
    with pytest.raises(BadInput, match="tracking_uri: 'http://outside.example' is not this server's MLflow store"):
        policy.admit_tracking("http://outside.example")
    FormPolicy(allowed=["tracking.uri"]).admit_tracking("http://outside.example")


def test_the_flow_run_reads_the_policy_serve_put_in_its_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(POLICY_ENV, raising=False)
    default = form_policy()
    assert default.allowed == list(DEFAULT_ALLOWED) and default.recipe_roots == [str(shipped_root()), os.getcwd()]
    served = serving_policy(TINY, allow=["workdir"], tracking_uris=["sqlite:///x.db"])
    monkeypatch.setenv(POLICY_ENV, served.to_env()[POLICY_ENV])
    assert form_policy() == served


def test_the_deployed_flows_refuse_before_any_work_naming_the_key(monkeypatch, tmp_path):
    monkeypatch.setenv(POLICY_ENV, serving_policy(TINY).model_dump_json())
    workdir = tmp_path / "w"
    with pytest.raises(BadInput, match="overrides: workdir may not be set from a form"):
        run_recipe_flow.fn(recipe=str(TINY), stages=["pretrain"], overrides=[f"workdir={workdir}"])
    elsewhere = tmp_path / "r.yaml"
    elsewhere.write_text(f"base: {TINY}\n")
    with pytest.raises(BadInput, match="recipe: .*r.yaml is outside the directories this server serves recipes from"):
        run_recipe_flow.fn(recipe=str(elsewhere))
    with pytest.raises(BadInput, match="variants: stages.sft.launch.env.image may not be set"):
        ablate_recipe_flow.fn(str(TINY), "sft", ["a", "b:stages.sft.launch.env.image=x"])
    with pytest.raises(BadInput, match="start: model.from may not be set"):
        ablate_recipe_flow.fn(str(TINY), "sft", ["a", "b:stages.sft.stages[0].optimizer.lr=0.01"], start="/tmp")
    with pytest.raises(BadInput, match="overrides: data.build.ray.address may not be set from a form"):
        data_build_flow.fn(str(TINY), overrides=["data.build.ray.address=10.0.0.5:6379"])
    with pytest.raises(BadInput, match="recipe: .*r.yaml is outside the directories"):
        data_build_flow.fn(str(elsewhere))
    assert not workdir.exists()
