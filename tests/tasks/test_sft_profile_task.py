"""The SFT stage's data profile task (`.fn`, a fake tracker): files, metrics, artifacts, reuse."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from stagewise.data.sft_config import CurateConfig, SFTDataSource, SFTWorldConfig
from stagewise.store.steps import value_of
from stagewise.tasks.data_profile import ARTIFACT_DIR, sft_profile_task
from stagewise.tasks.sft_data import curate_task, sft_world_task

SOURCES = [SFTDataSource(name="calculator", path="@world/sft_calculator.jsonl"),
           SFTDataSource(name="sorting", path="@world/sft_sorting.jsonl"),
           SFTDataSource(name="dirty", path="@world/sft_dirty.jsonl", domain="sorting", max_reject_rate=0.3)]


class FakeTracker:
    def __init__(self):
        self.metrics, self.artifacts = {}, []

    def log_metrics(self, run_id, records):
        for _, _, m in records:
            self.metrics |= m

    def log_artifact(self, run_id, path, artifact_dir=None):
        self.artifacts.append((Path(path).name, artifact_dir))


def sub(name: str, seq_length: int, weights: dict) -> SimpleNamespace:
    return SimpleNamespace(name=name, seq_length=seq_length, blend=SimpleNamespace(weights=weights))


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    from stagewise.data.chat import install_chat_template
    from stagewise.data.tokenizer import train_bpe

    workdir = tmp_path_factory.mktemp("profw")
    world = value_of(sft_world_task.fn(SFTWorldConfig(per_domain=30, long_context=1), 50, 5, str(workdir)))
    curated = value_of(curate_task.fn(SOURCES, CurateConfig(), world, str(workdir), str(workdir)))
    texts = [line for f in sorted(Path(world).glob("sft_*.jsonl")) for line in f.read_text().splitlines()]
    tok_dir = tmp_path_factory.mktemp("tok")
    install_chat_template(train_bpe(texts, 500)).save_pretrained(tok_dir)
    return workdir, curated, str(tok_dir)


def test_profile_is_written_logged_and_reused(setting):
    workdir, curated, tok_dir = setting
    subs = [sub("one", 128, {"calculator": 1, "sorting": 1})]
    tracker = FakeTracker()
    root = Path(value_of(sft_profile_task.fn(curated, SOURCES, subs, CurateConfig(), tok_dir, str(workdir), tracker, "r")))
    report = json.loads((root / "profile.json").read_text())
    assert root.parent == Path(workdir) / "sft_data" and root.name.startswith("profile-")
    assert [s["name"] for s in report["sft_sources"]] == ["calculator", "sorting", "dirty"]
    assert sorted(tracker.artifacts) == [("profile.json", ARTIFACT_DIR), ("profile.png", ARTIFACT_DIR)]
    m = tracker.metrics
    assert m["data/profile/tools/top_share"] == 1.0 and m["data/profile/warnings"] == len(report["warnings"])
    assert m["data/profile/calculator/tokens_p99"] == report["sft_sources"][0]["tokens"]["p99"]
    shares = {d["domain"]: d["conversation_share"] for d in report["domains"]}
    assert m["data/profile/domain/sorting/conversation_share"] == shares["sorting"] > shares["calculator"]
    codes = {w["code"] for w in report["warnings"]}
    assert {"tool_share", "length_over_limit", "reject_rate"} <= codes  # calculator conversations exceed 128 tokens

    state = sft_profile_task.fn(curated, SOURCES, subs, CurateConfig(), tok_dir, str(workdir), FakeTracker(), "r")
    assert state.name == "Cached" and Path(value_of(state)) == root
    wider = value_of(sft_profile_task.fn(curated, SOURCES, [sub("one", 4096, {"calculator": 1, "sorting": 1})],
                                         CurateConfig(), tok_dir, str(workdir)))
    assert Path(wider) != root and "length_over_limit" not in {w["code"] for w in json.loads(
        (Path(wider) / "profile.json").read_text())["warnings"]}
