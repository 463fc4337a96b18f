"""The cutoff-promotion deployment: its flow, its form, and defaults taken from the recipe."""

from __future__ import annotations

from pathlib import Path

from stagewise.deployments.catalog import PROMOTE, build_deployments
from stagewise.recipe import available_stages

TINY = Path(__file__).resolve().parents[2] / "recipes" / "tiny.yaml"


def test_the_promotion_deployment_asks_for_a_rule_and_defaults_to_the_recipes_store():
    made = {d.name: d for d in build_deployments(TINY, schedule=False)}
    promote = made[PROMOTE]
    assert promote.flow_name == "stagewise-promote" and promote.entrypoint == "stagewise.flows.promote.promote_flow"
    assert promote.parameters == {"experiment": "tiny", "stage": "pretrain",
                                  "tracking_uri": f"sqlite:///{(Path.cwd() / 'runs' / 'tiny' / 'mlflow.db').resolve()}"}
    form = promote._parameter_openapi_schema
    assert form.required == ["experiment", "stage", "rule"]
    assert form.properties["stage"]["enum"] == available_stages()
    assert "YAML rule file" in form.properties["rule"]["description"]
    assert promote.enforce_parameter_schema and not promote.schedules
