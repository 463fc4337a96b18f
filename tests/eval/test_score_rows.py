"""`stagewise eval CKPT --rows FILE` (eval/score_rows.py): the RL held-out scorer on any checkpoint and rows."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from stagewise.cli import app
from stagewise.data.errors import BadInput
from stagewise.eval.score_rows import score_rows

runner = CliRunner()


def _write(path, rows: list[dict]):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _gym_row(answer, domain: str, i: int) -> dict:
    """A NeMo Gym-style row: keys this project does not know, an int id, request settings."""
    return {"responses_create_params": {"input": [{"role": "user", "content": f"What is {i} + {i}?"}],
                                        "temperature": 0.6, "max_output_tokens": 64},
            "expected_answer": answer, "id": i, "domain": domain, "environment": "exact_answer",
            "agent_ref": {"type": "responses_api_agents", "name": "math_simple"}, "question": f"{i} + {i}"}


class AlwaysFortyTwo:
    """Stand-in for HFGenerator that answers "42" to every prompt: which rows it gets right is known
    from their expected answers alone, so the per-domain means can be checked without a trained model."""

    answer: list[int] = []

    def __init__(self, policy, end_ids, pad_id, device="cpu"):
        self.end = list(end_ids)

    def generate(self, prompts, n, max_new_tokens, temperature, seed):
        from stagewise.model.rollout import Rollout

        return [[Rollout(list(p), [*self.answer, self.end[0]], finished=True) for _ in range(n)] for p in prompts]


@pytest.fixture
def forty_two(monkeypatch, tiny_checkpoint):
    from transformers import AutoTokenizer

    import stagewise.eval.score_rows as score_rows_module

    AlwaysFortyTwo.answer = AutoTokenizer.from_pretrained(tiny_checkpoint)("42", add_special_tokens=False).input_ids
    monkeypatch.setattr(score_rows_module, "HFGenerator", AlwaysFortyTwo)


def test_pass_at_1_and_greedy_per_domain_are_the_verifiers_mean(tmp_path, tiny_checkpoint, forty_two):
    # domain a: 2 of 3 rows expect 42; domain b: 1 of 2; over all prompts 3 of 5
    rows = _write(tmp_path / "team.jsonl", [_gym_row(42, "a", 1), _gym_row(42, "a", 2), _gym_row(7, "a", 3),
                                             _gym_row(42, "b", 4), _gym_row(1, "b", 5)])
    scores = score_rows(tiny_checkpoint, rows, samples=3, max_new_tokens=4)
    assert scores["prompts"] == {"a": 3, "b": 2}
    assert scores["pass_at_1"] == pytest.approx({"a": 2 / 3, "b": 0.5, "all": 0.6})
    assert scores["greedy"] == pytest.approx({"a": 2 / 3, "b": 0.5, "all": 0.6})
    # every answer is 42, so each prompt's pass@1 is 0 or 1: Wilson's interval of 3 of 5, 2 of 3, 1 of 2
    from stagewise.eval.intervals import wilson

    assert scores["pass_at_1_interval"] == {"a": list(wilson(2, 3)), "all": list(wilson(3, 5)),
                                           "b": list(wilson(1, 2))}
    assert scores["pass_at_1_interval"]["all"] == pytest.approx([0.2307, 0.8824], abs=1e-4)  # textbook 3/5


def test_limit_takes_rows_round_robin_and_rows_without_domain_take_the_files_name(tmp_path, tiny_checkpoint, forty_two):
    plain = [{k: v for k, v in _gym_row(42, "x", i).items() if k != "domain"} for i in range(4)]
    rows = _write(tmp_path / "mine.jsonl", [*plain, _gym_row(3, "b", 9)])
    assert score_rows(tiny_checkpoint, rows, samples=1, limit=2)["prompts"] == {"b": 1, "mine": 1}


def test_a_row_without_an_environment_is_refused_before_the_model_loads(tmp_path, tiny_checkpoint):
    row = {k: v for k, v in _gym_row(4, "a", 2).items() if k != "environment"}
    rows = _write(tmp_path / "rows.jsonl", [_gym_row(4, "a", 1), row])
    with pytest.raises(BadInput, match=r"rows.jsonl: row 2: no environment: give --environment NAME"):
        score_rows(tiny_checkpoint, rows)
    with pytest.raises(BadInput, match="exact_answer"):  # an unknown one names the known ones
        score_rows(tiny_checkpoint, rows, environment="exactly")


def test_the_cli_scores_the_demo_worlds_rows_and_prints_json(tmp_path, tiny_checkpoint):
    from stagewise.data.world.rl_prompts import generate_rl_world

    paths = generate_rl_world(tmp_path / "world", seed=3, per_domain=20, eval_fraction=0.3)
    result = runner.invoke(app, ["eval", str(tiny_checkpoint), "--rows", str(paths["eval"]), "--samples", "2",
                                 "--max-new-tokens", "3", "--limit", "6", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    domains = {json.loads(line)["domain"] for line in paths["eval"].read_text().splitlines()}
    assert sum(report["prompts"].values()) == 6 and set(report["prompts"]) <= domains
    for kind in ("pass_at_1", "greedy"):
        assert set(report[kind]) == {*report["prompts"], "all"}
        assert all(0.0 <= v <= 1.0 for v in report[kind].values())
    assert (report["samples"], report["max_new_tokens"], report["limit"]) == (2, 3, 6)
    low, high = report["pass_at_1_interval"]["all"]
    assert 0.0 <= low <= report["pass_at_1"]["all"] <= high <= 1.0
    shown = runner.invoke(app, ["eval", str(tiny_checkpoint), "--rows", str(paths["eval"]), "--samples", "2",
                                "--max-new-tokens", "3", "--limit", "6"])
    assert "pass@1  (95% interval)" in shown.stdout and f"({low:.3f}-{high:.3f})" in shown.stdout


@pytest.mark.parametrize("args, message", [
    (["--rows", "{rows}", "--tasks", "world"], "without --suite or --tasks"),
    (["--rows", "{missing}"], "no such file"),
    (["--rows", "{rows}", "--environment", "nope"], "nope"),
])
def test_the_cli_exits_2_naming_what_is_wrong(tmp_path, tiny_checkpoint, args, message):
    rows = _write(tmp_path / "rows.jsonl", [_gym_row(4, "a", 1)])
    argv = [a.format(rows=rows, missing=tmp_path / "none.jsonl") for a in args]
    result = runner.invoke(app, ["eval", str(tiny_checkpoint), *argv])
    assert result.exit_code == 2, result.output
    assert message in result.output
