"""A data profile measured and written as files: `<stem>.json` (the report) and `<stem>.png` (its chart).

The SFT stage profiles its curated sources (tasks/data_profile.py logs the result to MLflow) and
`stagewise data profile` profiles a recipe's data; both write through here, so the files look the same.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from transformers import AutoTokenizer

from stagewise.data.profile import DataProfile, build_profile, profile_curated
from stagewise.data.sft_config import CurateConfig, SFTDataSource
from stagewise.eval.plots import data_profile_plot


def write_profile(out_dir: str | Path, report: DataProfile, stem: str = "profile", title: str = "") -> dict[str, str]:
    """`<out_dir>/<stem>.json` (the report) and `<stem>.png` (eval.plots.data_profile_plot); returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "png": out / f"{stem}.png"}
    paths["json"].write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    figure = data_profile_plot(report.model_dump(mode="json"), title)
    figure.savefig(paths["png"])
    plt.close(figure)
    return {k: str(p) for k, p in paths.items()}


def profile_sft_sources(curated_root: Path, sources: Sequence[SFTDataSource], substages: Sequence[Any],
                        cfg: CurateConfig, tokenizer_dir: str, out: Path) -> float:
    """Profile the curated sources (a curation step's directory) into `out`; returns the seconds it took."""
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)  # the chat start checkpoint's: it has the template
    report = build_profile([], profile_curated(curated_root, sources, tok, substages, cfg), tokenizer_dir, cfg)
    write_profile(out, report, "profile", "SFT data profile")
    return time.perf_counter() - start
