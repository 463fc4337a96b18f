"""The data profile in files and in MLflow: the SFT stage profiles its curated sources.

    root = value_of(sft_profile_task(curated, sources, substages, cfg, start.path, workdir, tracker, run_id))

The measuring and the files are eval/data_profile_files.py's (`stagewise data profile` writes the same).

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

from pathlib import Path
from typing import Any

from prefect import task

from stagewise.data.atomic import building
from stagewise.data.profile import PROFILE_VERSION, DataProfile, pack_limits, profile_metrics
from stagewise.data.sft_assembly import tokenizer_digest
from stagewise.data.sft_config import CurateConfig, SFTDataSource
from stagewise.eval.data_profile_files import profile_sft_sources
from stagewise.refs import CuratedRef
from stagewise.store.policy import retrying, run_logger
from stagewise.store.steps import cached, step_dir
from stagewise.store.tracking import Tracker

PROFILE_JSON, PROFILE_PNG = "profile.json", "profile.png"
ARTIFACT_DIR = "data_profile"


def _log_profile(report: DataProfile, root: Path, tracker: Tracker | None, run_id: str | None) -> None:
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


@task(**retrying("sft-profile"))
def sft_profile_task(curated: CuratedRef, sources: list[SFTDataSource], substages: list, cfg: CurateConfig,
                     tokenizer_dir: str, workdir: str, tracker: Tracker | None = None,
                     run_id: str | None = None) -> Any:
    """Profile the curated SFT sources once per (curated data, tokenizer, pack sizes); log it to the run.

    Returns the profile's directory (a Cached state when it was reused)."""
    limits = {s.name: pack_limits(substages, s.domain_name) for s in sources}
    spec = {"limits": limits, "curate": cfg, "version": PROFILE_VERSION}
    root = step_dir(Path(workdir) / "sft_data", "profile", spec, [curated.digest, tokenizer_digest(tokenizer_dir)])
    reused = (root / PROFILE_JSON).is_file()
    if not reused:
        with building(root) as tmp:
            seconds = profile_sft_sources(Path(curated.root), sources, substages, cfg, tokenizer_dir, tmp)
        run_logger().info("data profile of %d SFT sources took %.2f s", len(sources), seconds)
    report = DataProfile.model_validate_json((root / PROFILE_JSON).read_text(encoding="utf-8"))
    _log_profile(report, root, tracker, run_id)
    if reused:
        return cached(str(root), root.name.removeprefix("profile-"), f"SFT data profile: reused {root}")
    return str(root)
