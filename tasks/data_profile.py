"""The data profile in files and in MLflow: the SFT stage profiles its curated sources.

    root = value_of(sft_profile_task(curated, sources, substages, cfg, start.path, workdir, tracker, run_id))
    paths = write_profile(out_dir, report, "profile")      # profile.json + profile.png (also the CLI's)

The profile is a content-addressed step like the other SFT data steps:
`<workdir>/sft_data/profile-<hash>/{profile.json,profile.png}`, the hash over the curated data's
digest, the tokenizer files, the pack sizes and the curation settings; an unchanged recipe reads
it back instead of measuring again. Logged to the SFT stage run at step 0: artifacts
`data_profile/profile.json` and `data_profile/profile.png`, metrics
`data/profile/<source>/{tokens_mean,tokens_p99}`,
`data/profile/domain/<domain>/{conversation_share,token_share}`, `data/profile/tools/top_share`
and `data/profile/warnings` (how many); each warning is a log line.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import task

from stagewise.data.profile import PROFILE_VERSION, DataProfile
from stagewise.data.sft_config import CurateConfig, SFTDataSource
from stagewise.tasks.policy import retrying, run_logger
from stagewise.tasks.sft_data import CuratedRef, tokenizer_digest
from stagewise.store.steps import cached, step_dir
from stagewise.store.tracking import Tracker

PROFILE_JSON, PROFILE_PNG = "profile.json", "profile.png"
ARTIFACT_DIR = "data_profile"


def write_profile(out_dir: str | Path, report: DataProfile, stem: str = "profile", title: str = "") -> dict[str, str]:
    """`<out_dir>/<stem>.json` (the report) and `<stem>.png` (eval.plots.data_profile_plot); returns both paths."""
    import matplotlib.pyplot as plt

    from stagewise.eval.plots import data_profile_plot

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "png": out / f"{stem}.png"}
    paths["json"].write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    figure = data_profile_plot(report.model_dump(mode="json"), title)
    figure.savefig(paths["png"])
    plt.close(figure)
    return {k: str(p) for k, p in paths.items()}


def profile_metrics(report: DataProfile) -> dict[str, float]:
    """The few numbers worth a chart: per source mean/p99 tokens, per domain shares, the top tool's share."""
    out: dict[str, float] = {"data/profile/warnings": len(report.warnings)}
    for s in report.sft_sources:
        out |= {f"data/profile/{s.name}/tokens_mean": s.tokens.mean, f"data/profile/{s.name}/tokens_p99": s.tokens.p99}
    for d in report.domains:
        out |= {f"data/profile/domain/{d.domain}/conversation_share": d.conversation_share,
                f"data/profile/domain/{d.domain}/token_share": d.token_share}
    if report.tools.top_share is not None:
        out["data/profile/tools/top_share"] = report.tools.top_share
    return out


def log_profile(report: DataProfile, root: Path, tracker: Tracker | None, run_id: str | None) -> None:
    """Warnings as log lines; metrics and the two files in the run (under data_profile/)."""
    logger = run_logger()
    logger.info("data profile: %d SFT sources, %d warning(s)", len(report.sft_sources), len(report.warnings))
    for w in report.warnings:
        logger.warning("data profile: %s", w.message)
    if not (tracker and run_id):
        return
    tracker.log_metrics(run_id, [(0, 0, profile_metrics(report))])
    for name in (PROFILE_JSON, PROFILE_PNG):
        tracker.log_artifact(run_id, root / name, ARTIFACT_DIR)


def _measure(curated: CuratedRef, sources: Sequence[SFTDataSource], substages: Sequence[Any], cfg: CurateConfig,
             tokenizer_dir: str, out: Path) -> float:
    """Profile the curated sources into `out`; returns the seconds it took."""
    from transformers import AutoTokenizer

    from stagewise.data.profile import build_profile, profile_curated

    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)  # the chat start checkpoint's: it has the template
    report = build_profile([], profile_curated(Path(curated.root), sources, tok, substages, cfg), tokenizer_dir, cfg)
    write_profile(out, report, "profile", "SFT data profile")
    return time.perf_counter() - start


@task(**retrying("sft-profile"))
def sft_profile_task(curated: CuratedRef, sources: list[SFTDataSource], substages: list, cfg: CurateConfig,
                     tokenizer_dir: str, workdir: str, tracker: Tracker | None = None,
                     run_id: str | None = None) -> Any:
    """Profile the curated SFT sources once per (curated data, tokenizer, pack sizes); log it to the run.

    Returns the profile's directory (a Cached state when it was reused)."""
    from stagewise.data.atomic import building
    from stagewise.data.profile import pack_limits

    limits = {s.name: pack_limits(substages, s.domain_name) for s in sources}
    spec = {"limits": limits, "curate": cfg, "version": PROFILE_VERSION}
    root = step_dir(Path(workdir) / "sft_data", "profile", spec, [curated.digest, tokenizer_digest(tokenizer_dir)])
    reused = (root / PROFILE_JSON).is_file()
    if not reused:
        with building(root) as tmp:
            seconds = _measure(curated, sources, substages, cfg, tokenizer_dir, tmp)
        run_logger().info("data profile of %d SFT sources took %.2f s", len(sources), seconds)
    report = DataProfile.model_validate_json((root / PROFILE_JSON).read_text(encoding="utf-8"))
    log_profile(report, root, tracker, run_id)
    if reused:
        return cached(str(root), root.name.removeprefix("profile-"), f"SFT data profile: reused {root}")
    return str(root)
