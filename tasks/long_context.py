"""Prefect tasks of the long-context stage: document-QA shards, and the needle evaluation."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from transformers import AutoTokenizer

from stagewise.data.digest import file_sha256 as file_hash
from stagewise.data.long_context import prepare_doc_qa
from stagewise.data.long_context_config import DocQAConfig
from stagewise.data.shards import TokenShard
from stagewise.eval.needle import needle_eval
from stagewise.model.build import load_model
from stagewise.refs import CheckpointRef
from stagewise.store.policy import retrying
from stagewise.store.steps import cached, step_dir
from stagewise.store.tracking import Tracker


@task(**retrying("prepare-doc-qa"))
def doc_qa_task(tokenizer_dir: str, cfg: DocQAConfig, seed: int, workdir: str):
    """Document-QA train/val shards under `<workdir>/data/doc_qa-<hash>`: {"train": dir, "val": dir},
    or a Cached state holding them when the step was reused (unwrap with store.steps.value_of)."""
    tok_files = sorted(p for p in Path(tokenizer_dir).glob("tokenizer*.json"))
    out = step_dir(Path(workdir) / "data", "doc_qa", {"config": cfg, "seed": seed}, [file_hash(p) for p in tok_files])
    shards = {"train": str(out / "train"), "val": str(out / "val")}
    if (out / "train").exists():
        return cached(shards, out.name.removeprefix("doc_qa-"), f"document QA: reused {out}")
    prepare_doc_qa(AutoTokenizer.from_pretrained(tokenizer_dir), out, cfg, seed)
    get_run_logger().info("document QA shards written to %s", out)
    return shards


@task(**retrying("needle-eval"))
def needle_task(
    checkpoint: CheckpointRef,
    lengths: list[int],
    per_length: int,
    val_shards: dict[str, str],
    seed: int,
    tracker: Tracker | None = None,
    run_id: str | None = None,
    at: tuple[int, int] | None = None,
    device: str = "cpu",
) -> dict[str, float]:
    """Retrieval accuracy and per-length loss; logged as `eval/needle/...` and `eval/loss/<len>`.

    `at` overrides the (step, tokens) the metrics are logged at (the start model of a stage is
    logged at 0, whatever its own step was in the stage that made it)."""
    model = load_model(Path(checkpoint.path), device=device)
    tok = AutoTokenizer.from_pretrained(checkpoint.path)
    streams = {name: TokenShard.open(Path(p)).tokens for name, p in val_shards.items()}
    scores = needle_eval(model, tok, lengths, per_length, seed, streams=streams, device=device)
    metrics = {f"eval/{k}": v for k, v in scores.items()}
    step, tokens = at if at is not None else (checkpoint.step, checkpoint.tokens_seen)
    get_run_logger().info("needle eval at %d tokens: %s", tokens,
                          ", ".join(f"{k}={v:.3f}" for k, v in sorted(metrics.items())))
    if tracker and run_id:
        tracker.log_metrics(run_id, [(step, tokens, metrics)])
    return metrics
