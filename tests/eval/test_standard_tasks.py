"""Standard lm-eval tasks on local files: gsm8k and arc_easy run offline through the harness with their
own prompts and metrics, chat tasks render through the tokenizer's template, and missing data is refused."""

from __future__ import annotations

import json
import socket
import sys

import pytest

from stagewise.data.errors import BadInput
from stagewise.eval.harness import UnknownTaskError, check_tasks, local_metric_names, run_tasks
from stagewise.eval.standard_tasks import CodeNeeds, _missing_code
from stagewise.eval.task_spec import parse_task

GSM8K_TEST = [("What is 1 plus 2?", "1+2=3\n#### 3"), ("What is 3 plus 4?", "3+4=7\n#### 7"),
              ("What is 5 plus 6?", "5+6=11\n#### 11"), ("What is 7 plus 8?", "7+8=15\n#### 15"),
              ("What is 9 plus 1?", "9+1=10\n#### 10")]
GSM8K_TRAIN = [("What is 2 times 2?", "2*2=4\n#### 4"), ("What is 3 times 3?", "3*3=9\n#### 9"),
               ("What is 2 times 5?", "2*5=10\n#### 10"), ("What is 4 times 4?", "4*4=16\n#### 16"),
               ("What is 6 times 1?", "6*1=6\n#### 6")]
ARC_TEST = [{"id": f"q{i}", "question": f"Which number is largest: {i}, {i + 1} or {i + 2}?",
             "choices": {"text": [str(i), str(i + 1), str(i + 2)], "label": ["A", "B", "C"]}, "answerKey": "C"}
            for i in range(5)]
LOCAL = ("world_arithmetic, world_arithmetic_mc, world_chat_format, world_compare_mc, world_lookup, world_sorting, "
         "world")


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """gsm8k (test, train: JSONL) and arc_easy (test: one Parquet shard, as the Hub names it) under the
    current directory, with the Hub unreachable: offline flags set and every internet socket refused."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    connect = socket.socket.connect

    def no_internet(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(f"test: no network (tried {address})")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", no_internet)
    _jsonl(tmp_path / "evaldata/gsm8k/test.jsonl", [{"question": q, "answer": a} for q, a in GSM8K_TEST])
    _jsonl(tmp_path / "evaldata/gsm8k/train.jsonl", [{"question": q, "answer": a} for q, a in GSM8K_TRAIN])
    (tmp_path / "evaldata/arc_easy").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(ARC_TEST), tmp_path / "evaldata/arc_easy/test-00000-of-00001.parquet")
    return tmp_path / "evaldata"


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    """(model, tokenizer) of the tiny test checkpoint (its tokenizer carries no chat template)."""
    from transformers import AutoTokenizer

    from stagewise.model.build import load_model

    return load_model(tiny_checkpoint, device="cpu"), AutoTokenizer.from_pretrained(str(tiny_checkpoint))


@pytest.fixture
def prompts(monkeypatch):
    """The contexts lm-eval hands the model (request by request), and generations cut to 4 new tokens."""
    from lm_eval.models.huggingface import HFLM

    seen: dict[str, list[str]] = {"loglikelihood": [], "generate_until": []}
    for kind in seen:
        method = getattr(HFLM, kind)

        def spy(self, requests, *args, _kind=kind, _method=method, **kwargs):
            seen[_kind] += [r.args[0] for r in requests]
            return _method(self, requests, *args, **kwargs)

        monkeypatch.setattr(HFLM, kind, spy)
    monkeypatch.setattr(HFLM, "max_gen_toks", property(lambda self: 4))
    return seen


def test_gsm8k_and_arc_easy_run_their_own_configs_on_local_files(bench, tiny, prompts):
    model, tok = tiny
    result = run_tasks(model, tok, ["gsm8k@evaldata/gsm8k", "arc_easy@evaldata/arc_easy"], batch_size=8)
    assert set(result.metrics) == {"gsm8k/exact_match/strict-match", "gsm8k/exact_match/flexible-extract",
                                   "arc_easy/acc", "arc_easy/acc_norm"}
    assert all(0.0 <= v <= 1.0 for v in result.metrics.values())
    assert result.raw["n-samples"] == {"gsm8k": {"original": 5, "effective": 5}, "arc_easy": {"original": 5, "effective": 5}}
    assert result.raw["n-shot"] == {"gsm8k": 5, "arc_easy": 0}  # gsm8k's own 5-shot setting
    assert result.raw["configs"]["gsm8k"]["dataset_path"] == str(bench / "gsm8k")
    assert result.raw["chat_tasks"] == []
    # arc_easy's own prompt, one loglikelihood request per choice
    assert prompts["loglikelihood"] == [f"Question: {r['question']}\nAnswer:" for r in ARC_TEST for _ in range(3)]
    # gsm8k's own prompt: five examples from train.jsonl (in the seeded order), then the test question
    assert len(prompts["generate_until"]) == 5
    first = next(p for p in prompts["generate_until"] if p.endswith(f"Question: {GSM8K_TEST[0][0]}\nAnswer:"))
    shots = first.split("\n\n")[:-1]
    assert sorted(shots) == sorted(f"Question: {q}\nAnswer: {a}" for q, a in GSM8K_TRAIN)


def test_a_chat_task_renders_through_the_tokenizers_own_template(bench, tiny, prompts):
    from stagewise.data.chat import install_chat_template

    model, tok = tiny
    chat_tok = install_chat_template(type(tok).from_pretrained(tok.name_or_path))
    result = run_tasks(model, chat_tok, ["chat:arc_easy@evaldata/arc_easy", "chat:gsm8k@evaldata/gsm8k"])
    assert set(result.metrics) == {"gsm8k/exact_match/strict-match", "gsm8k/exact_match/flexible-extract",
                                   "arc_easy/acc", "arc_easy/acc_norm"}
    assert result.raw["chat_tasks"] == ["arc_easy", "gsm8k"]
    q = ARC_TEST[0]["question"]
    assert prompts["loglikelihood"][0] == f"<|im_start|>user\nQuestion: {q}\nAnswer:<|im_end|>\n<|im_start|>assistant\n"
    assert prompts["loglikelihood"][0] == chat_tok.apply_chat_template(
        [{"role": "user", "content": f"Question: {q}\nAnswer:"}], tokenize=False, add_generation_prompt=True)
    # gsm8k's five examples become earlier turns (fewshot_as_multiturn), rendered by the same template
    first = next(p for p in prompts["generate_until"] if f"Question: {GSM8K_TEST[0][0]}\nAnswer:<|im_end|>" in p)
    assert first.count("<|im_start|>user\n") == 6 and first.count("<|im_start|>assistant\n") == 6
    assert first.endswith(f"<|im_start|>user\nQuestion: {GSM8K_TEST[0][0]}\nAnswer:<|im_end|>\n<|im_start|>assistant\n")


def test_a_chat_task_needs_a_tokenizer_with_a_template(bench, tiny):
    with pytest.raises(BadInput) as e:
        run_tasks(*tiny, ["chat:arc_easy@evaldata/arc_easy"])
    assert str(e.value) == ("chat:arc_easy@evaldata/arc_easy: a chat: task renders its prompts with the tokenizer's "
                            "chat template, and this tokenizer has none (evaluate a checkpoint whose tokenizer "
                            "carries one, or drop chat:)")


# --------------------------------------------------------------------------- refusals (no model)

def _refused(entry: str) -> str:
    with pytest.raises(BadInput) as e:
        check_tasks([entry])
    return str(e.value)


def test_a_standard_task_without_data_says_which_files_to_provide(bench):
    assert _refused("gsm8k") == (
        "gsm8k is a standard lm-eval task and nothing is downloaded: write gsm8k@FOLDER, a folder holding "
        "test.jsonl or test.parquet (the rows gsm8k scores) with columns answer, question; train.jsonl or "
        "train.parquet (its 5-shot examples) with columns answer, question")
    assert _refused("arc_easy@nowhere") == (
        f"arc_easy@nowhere: no folder {bench.parent / 'nowhere'} (relative to the current directory); it must hold "
        "test.jsonl or test.parquet (the rows arc_easy scores) with columns answerKey, choices, question")


def test_missing_split_files_and_columns_are_named(bench):
    (bench / "gsm8k/train.jsonl").rename(bench / "gsm8k/dev.jsonl")
    assert _refused("gsm8k@evaldata/gsm8k").splitlines() == [
        "gsm8k@evaldata/gsm8k: dev.jsonl is not a split gsm8k reads (test, train)",
        "gsm8k@evaldata/gsm8k: provide train.jsonl or train.parquet (its 5-shot examples) with columns answer, question"]
    _jsonl(bench / "arc2/test.jsonl", [{"question": "Q?", "choices": {"text": ["a"], "label": ["A"]}}])
    assert _refused("arc_easy@evaldata/arc2") == (
        "arc_easy@evaldata/arc2: test.jsonl lacks column(s) answerKey (it has question, choices)")
    _jsonl(bench / "empty/test.jsonl", [])
    assert _refused("arc_easy@evaldata/empty") == "arc_easy@evaldata/empty: test.jsonl has no rows"


def test_a_column_only_the_tasks_own_code_reads_is_named_when_it_is_built(bench):
    """hellaswag's rows go through its process_docs (no template shows the columns): building it reads them."""
    row = {"ctx_a": "A man sits.", "activity_label": "Sitting", "endings": ["He stands.", "He sits."], "label": "0"}
    _jsonl(bench / "hellaswag/validation.jsonl", [row])
    check_tasks(["hellaswag@evaldata/hellaswag"])  # the files are there: what the code reads is not known yet
    from stagewise.eval.harness import task_manager

    with pytest.raises(BadInput) as e:
        task_manager(["hellaswag@evaldata/hellaswag"])
    assert str(e.value) == ("hellaswag@evaldata/hellaswag: the task reads 'ctx_b' from a row and its files lack it "
                            "(columns of its first rows: activity_label, ctx_a, endings, label)")


def test_unknown_names_groups_and_misused_entries(bench):
    with pytest.raises(UnknownTaskError) as e:
        check_tasks(["gsm8kk@evaldata/gsm8k"])
    assert str(e.value) == f"unknown lm-eval task gsm8kk (nearest: gsm8k, gsm8k_cot); local tasks: {LOCAL}"
    assert _refused("mmlu") == ("mmlu is a group of lm-eval tasks, each with its own dataset: list its tasks one "
                                "by one, each as TASK@FOLDER")
    assert _refused("world_lookup@evaldata/gsm8k") == (
        "world_lookup@evaldata/gsm8k: world_lookup is a local task with its own items (eval/benchmarks/data/); "
        "drop @evaldata/gsm8k")
    assert _refused("chat:world_lookup") == (
        "chat:world_lookup: chat: renders a standard task's prompts with the chat template; the local tasks' items "
        "are already written as the model reads them (world_chat_format's as chat turns)")
    with pytest.raises(BadInput) as e:
        check_tasks(["gsm8k@evaldata/gsm8k", "chat:gsm8k@evaldata/gsm8k"])
    assert str(e.value) == ("chat:gsm8k@evaldata/gsm8k: gsm8k is already in the list (as gsm8k@evaldata/gsm8k); its "
                            "metrics would collide, so give each variant its own suite")


def test_task_code_needs_are_refused_before_it_is_imported(bench):
    assert _missing_code(CodeNeeds(packages=("surely_not_installed_pkg", "pytest>=999"))) == [
        "Python package surely_not_installed_pkg (pip install 'surely_not_installed_pkg')",
        f"Python package pytest>=999 (installed: {pytest.__version__})"]
    import importlib.util

    if importlib.util.find_spec("langdetect") is None:  # this machine: ifeval's packages are not installed
        assert _refused("ifeval@evaldata/gsm8k").startswith(
            "ifeval needs, on this machine and offline: Python package langdetect (pip install 'langdetect'); ")
        assert "lm_eval.tasks.ifeval.utils" not in sys.modules  # its code (which downloads NLTK data) never ran


def test_entry_syntax():
    assert parse_task("chat:gsm8k@data/g s").model_dump() == {"name": "gsm8k", "data": "data/g s", "chat": True}
    assert parse_task("world").model_dump() == {"name": "world", "data": None, "chat": False}
    assert parse_task("chat:gsm8k@data/g s").text == "chat:gsm8k@data/g s"
    with pytest.raises(ValueError) as e:
        parse_task("gsm8k@")
    assert str(e.value) == "'gsm8k@': give the folder of the task's data files after @ (TASK, TASK@FOLDER or chat:TASK@FOLDER)"
    with pytest.raises(ValueError) as e:
        parse_task("two words")
    assert str(e.value) == ("'two words' is not a task entry: write TASK, TASK@FOLDER or chat:TASK@FOLDER (task names "
                            "use letters, digits, _ . -)")


def test_gate_metric_names_treat_entries_as_their_task():
    names, outside = local_metric_names(["world_lookup", "chat:gsm8k@evaldata/gsm8k", "arc_easy@x"])
    assert names == {"world_lookup/exact_match"} and outside == ["gsm8k", "arc_easy"]


def test_the_recipe_refuses_missing_eval_data_before_any_work(bench):
    from stagewise.recipe import load_recipe
    from stagewise.recipe.shipped import resolve_recipe

    with pytest.raises(BadInput) as e:
        load_recipe(resolve_recipe("tiny"), ["eval.bench=[world_lookup, arc_easy@evaldata/nothing]"])
    assert str(e.value).splitlines()[1:] == [
        f"  eval.bench[1]: arc_easy@evaldata/nothing: no folder {bench / 'nothing'} (relative to the current "
        "directory); it must hold test.jsonl or test.parquet (the rows arc_easy scores) with columns answerKey, "
        "choices, question (--set eval.bench=[world_lookup, arc_easy@evaldata/nothing])"]
    loaded = load_recipe(resolve_recipe("tiny"), ["eval.bench=[gsm8k@evaldata/gsm8k, chat:arc_easy@evaldata/arc_easy]"])
    assert loaded.recipe.eval["bench"] == ["gsm8k@evaldata/gsm8k", "chat:arc_easy@evaldata/arc_easy"]
