"""Demo-world RL rows: deterministic from the seed, held-out prompts disjoint from training, and
every row's own verifier scores its reference completion 1.0."""

from __future__ import annotations

import json

import pytest

from stagewise.data.rl_rows import prompt_key, prompt_messages, read_rows
from stagewise.data.world.calculator import evaluate
from stagewise.data.world.rl_prompts import (
    ENVIRONMENTS,
    RL_DOMAINS,
    domain_rows,
    generate_rl_world,
    reference_completion,
)
from stagewise.eval.environments import get_environment

DOMAIN_ENVS = {"arithmetic": {"exact_answer"}, "format": {"json_answer", "uppercase"},
               "calculator": {"calculator"}, "sorting": {"sorting"}}


def test_the_environments_table_is_what_the_rows_name():
    assert {d: set(envs) for d, envs in ENVIRONMENTS.items()} == DOMAIN_ENVS


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return generate_rl_world(tmp_path_factory.mktemp("rl_world"), seed=3, per_domain=60, eval_fraction=0.2,
                             n_entities=200)


def test_files_and_domains(world):
    assert set(world) == {*RL_DOMAINS, "eval"}
    assert {p.name for p in world.values()} == {f"rl_{d}.jsonl" for d in RL_DOMAINS} | {"rl_eval.jsonl"}
    for domain in RL_DOMAINS:
        rows = read_rows(world[domain])
        assert rows and all(r.domain == domain and r.environment in DOMAIN_ENVS[domain] for r in rows)
    held_out = read_rows(world["eval"])
    assert {r.domain for r in held_out} == set(RL_DOMAINS)
    total = sum(len(read_rows(world[d])) for d in RL_DOMAINS) + len(held_out)
    assert total == 60 * len(RL_DOMAINS)
    assert 0.05 < len(held_out) / total < 0.4
    assert {r.environment for r in read_rows(world["format"])} == {"json_answer", "uppercase"}


def test_deterministic_from_the_seed(world, tmp_path):
    again = generate_rl_world(tmp_path / "a", seed=3, per_domain=60, eval_fraction=0.2, n_entities=200)
    other = generate_rl_world(tmp_path / "b", seed=4, per_domain=60, eval_fraction=0.2, n_entities=200)
    for name, path in world.items():
        assert again[name].read_bytes() == path.read_bytes()
    assert other["arithmetic"].read_bytes() != world["arithmetic"].read_bytes()


def test_held_out_prompts_are_never_trained_on(world):
    train = {prompt_key(r) for d in RL_DOMAINS for r in read_rows(world[d])}
    held_out = {prompt_key(r) for r in read_rows(world["eval"])}
    assert held_out and not train & held_out


def test_prompts_are_distinct_within_a_domain(world):
    for domain in ("arithmetic", "calculator", "sorting"):
        keys = [prompt_key(r) for r in domain_rows(domain, 60, 3, 200)]
        assert len(set(keys)) == len(keys)


def test_every_row_verifies_its_reference_completion(world):
    rows = [r for path in world.values() for r in read_rows(path)]
    assert len(rows) == 60 * len(RL_DOMAINS)
    for r in rows:
        env = get_environment(r.environment)
        ref = reference_completion(r)
        assert env.verify(ref, r) == 1.0, (r.id, ref)
        assert env.well_formed(ref, r), (r.id, ref)
        assert env.verify("I do not know", r) == 0.0, r.id  # and a non-answer is wrong


def test_rows_carry_what_their_verifier_needs(world):
    calc = read_rows(world["calculator"])[0]
    assert calc.responses_create_params.tools[0]["function"]["name"] == "calculator"
    assert str(calc.expected_answer) == evaluate(calc.expression)
    assert reference_completion(calc) == ('<tool_call>\n{"name": "calculator", "arguments": '
                                          + json.dumps({"expression": calc.expression}) + "}\n</tool_call>")
    for r in read_rows(world["sorting"]):
        way = prompt_messages(r)[-1]["content"]
        assert r.expected_answer == sorted(r.expected_answer, reverse="descending" in way)
    for r in read_rows(world["arithmetic"]):
        assert isinstance(r.expected_answer, int) and prompt_messages(r)[-1]["role"] == "user"


def test_unknown_domain_and_environment():
    with pytest.raises(ValueError, match="unknown RL domain 'lookup'"):
        domain_rows("lookup", 1, 0)
    row = domain_rows("arithmetic", 1, 0)[0]
    row.environment = "maths"
    with pytest.raises(ValueError, match="no reference completion for environment 'maths'"):
        reference_completion(row)


def test_max_digits_and_format_kinds_keep_rows_within_reach(tmp_path):
    import re

    from stagewise.data.rl_rows import prompt_messages, read_rows
    from stagewise.data.world.rl_prompts import generate_rl_world

    paths = generate_rl_world(tmp_path, seed=3, per_domain=40, eval_fraction=0.2, n_entities=50, max_digits=1,
                              format_kinds=("json_answer",))
    for domain in ("arithmetic", "format"):
        rows = read_rows(paths[domain])
        assert len(rows) >= 25
        for row in rows:
            numbers = re.findall(r"\d+", " ".join(m["content"] for m in prompt_messages(row)))
            assert numbers and max(len(n) for n in numbers) == 1, row
    assert {r.environment for r in read_rows(paths["format"])} == {"json_answer"}
    assert len(read_rows(paths["sorting"])) >= 25  # other domains are untouched
