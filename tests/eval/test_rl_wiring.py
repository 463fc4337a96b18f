"""The RL stage's wiring (eval/rl_wiring.py): rows to prompts, completions to rewards, per-domain means;
and its held-out scores memoised per weights (eval/score_memo.py through tasks/rl.py's heldout_eval_task)."""

from __future__ import annotations

import json

import pytest

from stagewise.data.errors import BadInput
from stagewise.eval.rewards import RewardConfig
from stagewise.eval.rl_wiring import RLWiring, by_domain, load_rows
from stagewise.model.rollout import Rollout


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    from transformers import AutoTokenizer

    from stagewise.data.chat import install_chat_template

    return install_chat_template(AutoTokenizer.from_pretrained(tiny_checkpoint))


def _rows(tmp_path, rows: list[dict]):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROW = {"responses_create_params": {"input": "Compute 2 + 3."}, "expected_answer": 5, "environment": "exact_answer"}


def test_rows_get_their_domain_and_environment(tmp_path):
    path = _rows(tmp_path, [ROW, {**ROW, "domain": "sums", "id": 7}])
    a, b = load_rows(path, "arith", None, None)
    assert (a.id, a.domain, a.environment) == ("arith:1", "arith", "exact_answer")
    assert (b.id, b.domain) == ("arith:7", "sums")
    forced = load_rows(path, "arith", "maths", "json_answer")
    assert {t.domain for t in forced} == {"maths"} and {t.environment for t in forced} == {"json_answer"}


def test_a_row_without_environment_is_refused_by_line(tmp_path):
    path = _rows(tmp_path, [ROW, {k: v for k, v in ROW.items() if k != "environment"}])
    with pytest.raises(BadInput, match="row 2: no environment"):
        load_rows(path, "arith", None, None)
    with pytest.raises(BadInput, match="exact_answer"):  # an unknown one lists the known ones
        load_rows(path, "arith", None, "exact")


def test_completions_keep_reasoning_and_tool_markers(tmp_path, tokenizer):
    tasks = load_rows(_rows(tmp_path, [ROW]), "arith", None, None)
    wiring = RLWiring(tokenizer, tasks, RewardConfig(), reasoning=False)
    prompt = wiring.prompts["arith:1"]
    assert tokenizer.decode(list(prompt.ids)).endswith("<|im_start|>assistant\n")
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    encode = lambda text: tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
    traced = encode("<think>\n2 + 3 = 5.\n</think>\n5") + [end]
    assert wiring.text(traced) == "<think>\n2 + 3 = 5.\n</think>\n5"  # the end token goes, the markers stay
    group = [Rollout(list(prompt.ids), traced, finished=True), Rollout(list(prompt.ids), encode("6") + [end]),
             Rollout(list(prompt.ids), encode("5"))]
    assert wiring.score(prompt, group)["accuracy"] == [1.0, 0.0, 1.0]


def test_by_domain_weighs_every_prompt_the_same(tmp_path, tokenizer):
    tasks = load_rows(_rows(tmp_path, [ROW, {**ROW, "domain": "b"}, {**ROW, "domain": "b"}]), "a", None, None)
    wiring = RLWiring(tokenizer, tasks, RewardConfig(), reasoning=False)
    means = by_domain({"a:1": [1.0, 0.0], "a:2": [1.0], "a:3": [0.0, 0.0, 0.0, 0.0]}, wiring)
    assert means == {"a": 0.5, "b": 0.5, "all": 0.5}


class _CountingGenerator:
    """Answers "5" to every prompt, and counts how often it is asked."""

    def __init__(self, tokenizer):
        self.answer, self.calls = tokenizer("5", add_special_tokens=False).input_ids, 0

    def generate(self, prompts, n, max_new_tokens, temperature, seed):
        self.calls += 1
        return [[Rollout(list(p), list(self.answer)) for _ in range(n)] for p in prompts]


class _Tracker:
    def __init__(self):
        self.logged, self.files = [], {}

    def log_metrics(self, run_id, records):
        self.logged.extend(records)

    def log_json(self, run_id, obj, artifact_file):
        self.files[artifact_file] = obj


def test_heldout_scores_are_read_back_for_the_same_weights_only(tmp_path, tokenizer):
    from stagewise.eval.score_memo import ScoreMemo
    from stagewise.tasks.rl import heldout_eval_task

    tasks = load_rows(_rows(tmp_path, [ROW, {**ROW, "expected_answer": 6}]), "a", None, None)
    wiring = RLWiring(tokenizer, tasks, RewardConfig(), reasoning=False)
    gen, tracker, ids = _CountingGenerator(tokenizer), _Tracker(), [t.id for t in tasks]
    score = lambda weights, prefix: heldout_eval_task.fn(  # noqa: E731
        gen, wiring, ids, 2, 4, 1.0, 0, tracker, "run", (0, 0), prefix=prefix, memo=ScoreMemo(tmp_path), weights=weights)
    first = score("sha-a", "rl/test")
    assert first.metrics["rl/test/pass_at_1/a"] == 0.5 and gen.calls == 2  # sampled + greedy
    # each prompt's pass@1 (the generator answers 5: right for the first row, wrong for the second),
    # the items of the overall rate (an artifact too)
    assert first.items == {"rl/test/pass_at_1/all": {"a:1": 1.0, "a:2": 0.0}}
    assert tracker.files["heldout/rl/test/items_00000000.json"] == first.items
    again = score("sha-a", "distill/test/student")
    assert gen.calls == 2  # read back, not generated
    assert again.metrics == {k.replace("rl/test", "distill/test/student"): v for k, v in first.metrics.items()}
    assert again.items == {"distill/test/student/pass_at_1/all": first.items["rl/test/pass_at_1/all"]}
    assert tracker.logged[-1][2] == again.metrics  # logged under the caller's prefix
    score("sha-b", "rl/test")
    assert gen.calls == 4  # other weights: scored
    assert len(list(tmp_path.glob("heldout-*/scores.json"))) == 2
