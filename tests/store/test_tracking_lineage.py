"""Registered checkpoints carry their lineage: parent version, pipeline run, recipe hash, data; small
weights are kept in the run's artifacts, large ones referenced by path."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mlflow import MlflowClient

from stagewise.store.tracking import Tracker


def _ckpt(root: Path, name: str, size: int = 1000) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"\0" * size)
    return d


def test_a_version_links_to_its_parent_and_says_how_it_was_made(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp", artifact_root=str(tmp_path / "artifacts"))
    parent_run = tracker.start_run("tiny", {})
    pre_run, sft_run = (tracker.start_run(s, {}, parent_run) for s in ("pretrain", "sft"))
    pre, sft = _ckpt(tmp_path, "pre"), _ckpt(tmp_path, "sft")
    lineage = {"stagewise.pipeline_run": parent_run, "stagewise.recipe_hash": "abc", "stagewise.data": "/w/data/d1",
               "stagewise.prefect_flow_run_url": ""}
    v1 = tracker.register_checkpoint("exp", pre, pre_run, alias="pretrain", lineage=lineage)
    v2 = tracker.register_checkpoint("exp", sft, sft_run, alias="sft", parent=str(pre), lineage=lineage)
    client = MlflowClient(tracking_uri=tracker.uri, registry_uri=tracker.uri)
    first, second = client.get_model_version("exp", v1), client.get_model_version("exp", v2)
    assert "stagewise.parent_version" not in first.tags
    assert second.tags["stagewise.parent_version"] == v1 and second.tags["stagewise.parent_checkpoint"] == str(pre)
    assert second.tags["stagewise.pipeline_run"] == parent_run and second.tags["stagewise.recipe_hash"] == "abc"
    assert second.tags["stagewise.data"] == "/w/data/d1" and "stagewise.prefect_flow_run_url" not in second.tags
    assert str(client.get_model_version_by_alias("exp", "sft").version) == v2
    # small weights live in the run's artifacts (hard-linked: no second copy on disk)
    assert first.tags["stagewise.weights"] == "artifact"
    kept = Path(first.source) / "model.safetensors"
    assert kept.is_file() and str(tmp_path / "artifacts") in first.source and kept.stat().st_ino == (pre / "model.safetensors").stat().st_ino


def test_large_weights_are_registered_by_reference(tmp_path):
    tracker = replace(Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp", artifact_root=str(tmp_path / "a")),
                      inline_weights_mb=0.001)
    run = tracker.start_run("pretrain", {})
    big = _ckpt(tmp_path, "big", size=4096)
    version = tracker.register_checkpoint("exp", big, run, alias="pretrain")
    got = MlflowClient(tracking_uri=tracker.uri, registry_uri=tracker.uri).get_model_version("exp", version)
    assert got.tags["stagewise.weights"] == "reference" and got.source == str(big.resolve())
