"""Prefect tasks of the SFT data path: demo conversations -> curation -> per sub-stage blend and packs.

    world = sft_world_task(cfg.world, entities, seed, workdir)          # sft_<domain>.jsonl, sft_eval.jsonl
    curated = curate_task(cfg.sources, cfg.curate, world, base_dir, workdir, tracker, run_id)
    start = sft_start_task(pretrain_checkpoint, workdir)               # + chat template, <|im_end|> as eos
    packed = blend_pack_task(sub, 0, curated, None, start.path, seed, workdir, tracker, run_id)

Every output lies in a directory named by a hash of its inputs (Marin's rule): re-running
with the same inputs finds it and does nothing; any change makes a new one. Tasks hand
each other small refs (paths + digests), never conversations or tensors. The libraries do
the work (data/world/conversations.py, and data/sft_assembly.py over data/curate,
data/sft_blend.py and data/sft_packs.py); these tasks name the directories, log to MLflow and
refuse bad data with a message that names the recipe field. Metrics (all at step 0 of the SFT stage run):
`sft/curate/<source>/{total,kept,reject_rate,<reason>}`,
`sft/<substage>/{pack_efficiency,packs,dropped,supervised_tokens,conversations,reasoning_off}`,
`sft/<substage>/mix/<domain>` (the realised mixture; `kept_previous` is the share carried over).
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task

from stagewise.data.atomic import building
from stagewise.data.content_hash import step_hash
from stagewise.data.curate import CurationError
from stagewise.data.digest import rows_digest
from stagewise.data.reasoning_switch import SwitchSetting, switch_spec
from stagewise.data.sft_assembly import (
    SFTDataError,
    blend_and_pack,
    check_enough_packs,
    curate_sources,
    failed_rejects,
    make_chat_start,
    pack_seed,
    tokenizer_digest,
)
from stagewise.data.sft_config import CurateConfig, SFTDataSource, SFTWorldConfig
from stagewise.data.sources import resolve_path
from stagewise.data.world.conversations import generate_sft_world
from stagewise.eval.plots import reject_reasons_plot
from stagewise.model.checkpoint import META_FILE, read_meta, weights_sha256
from stagewise.refs import CheckpointRef, CuratedRef, PackedRef
from stagewise.store.policy import retrying, run_logger
from stagewise.store.steps import cached, step_dir
from stagewise.store.tracking import Tracker

SFT_DATA_VERSION = 5
"""Bump when the way SFT data is generated, curated, sampled or packed changes (new directories)."""


# --------------------------------------------------------------------------- tasks

@task(**retrying("sft-world"))
def sft_world_task(world: SFTWorldConfig, entities: int, seed: int, workdir: str) -> str:
    """Generate the demo world's SFT conversations once per (settings, seed); returns the directory."""
    key = step_hash("sft_world", {"world": world, "entities": entities, "seed": seed, "version": SFT_DATA_VERSION})
    out = Path(workdir) / "sft_world" / key
    if (out / "sft_eval.jsonl").is_file():
        return cached(str(out), key, f"SFT world: reused {out}")
    with building(out) as tmp:
        generate_sft_world(tmp, seed, world.per_domain, world.long_context, world.eval_fraction, entities)
    run_logger().info("SFT world written to %s", out)
    return str(out)


@task(**retrying("sft-curate"))
def curate_task(sources: list[SFTDataSource], cfg: CurateConfig, world_dir: str | None, base_dir: str,
                workdir: str, tracker: Tracker | None = None, run_id: str | None = None,
                reasoning_content: str = "keep") -> CuratedRef:
    """Curate every source (data/curate); log counts, reports, rejects and a reasons plot.

    A source above its max_reject_rate raises CurationError (the stage stops; its rejects
    file says why line by line). `reasoning_content`: the SFT data's field (`drop`: traces discarded)."""
    paths = {s.name: resolve_path(s.path, base_dir, world_dir) for s in sources}
    missing = [f"{s.name}: {paths[s.name]}" for s in sources if not paths[s.name].exists()]
    if missing:
        raise FileNotFoundError(f"stages.sft.data.sources: file(s) not found: {'; '.join(missing)}")
    drop = reasoning_content == "drop"
    spec = {"sources": sources, "curate": cfg, "version": SFT_DATA_VERSION} | ({"reasoning_content": "drop"} if drop else {})
    root = step_dir(Path(workdir) / "sft_data", "curated", spec, [rows_digest(paths[s.name], s.split) for s in sources])
    digest = root.name.removeprefix("curated-")
    reused = (root / "summary.json").is_file()
    if not reused:
        try:
            with building(root) as tmp:
                curate_sources(paths, sources, cfg, tmp, final=root, drop_reasoning=drop)
        except CurationError as err:
            if tracker and run_id:  # the rejects kept under <root>.failed/, also in MLflow's curation/
                tracker.log_artifact(run_id, failed_rejects(root, err.source), "curation")
            raise
    summary = json.loads((root / "summary.json").read_text())
    _log_curation(summary, root, tracker, run_id)
    ref = CuratedRef(root=str(root), digest=digest, files={s.name: str(root / f"{s.name}.jsonl") for s in sources},
                     domains={s.name: s.domain_name for s in sources})
    return cached(ref, digest, f"SFT curation: reused {root}") if reused else ref


def _log_curation(summary: dict, root: Path, tracker: Tracker | None, run_id: str | None) -> None:
    logger = run_logger()
    for name, r in summary.items():
        logger.info("curated %s: kept %d of %d (%s)", name, r["kept"], r["total"],
                    ", ".join(f"{k} {v}" for k, v in r["rejected"].items()) or "nothing rejected")
    if not (tracker and run_id):
        return
    metrics = {}
    for name, r in summary.items():
        metrics.update({f"sft/curate/{name}/total": r["total"], f"sft/curate/{name}/kept": r["kept"],
                        f"sft/curate/{name}/reject_rate": r["reject_rate"]})
        metrics.update({f"sft/curate/{name}/{reason}": n for reason, n in r["rejected"].items()})
    tracker.log_metrics(run_id, [(0, 0, metrics)])

    tracker.log_json(run_id, summary, "curation/summary.json")
    for name in summary:
        rejects = root / f"{name}.rejects.jsonl"
        if rejects.stat().st_size:
            tracker.log_artifact(run_id, rejects, "curation")
        tracker.log_artifact(run_id, root / f"{name}.report.json", "curation")
    figure = reject_reasons_plot({n: r["rejected"] for n, r in summary.items()}, {n: r["kept"] for n, r in summary.items()})
    tracker.log_figure(run_id, figure, "curation/reject_reasons.png")


@task(**retrying("sft-start"))
def sft_start_task(checkpoint: str, workdir: str) -> CheckpointRef:
    """The starting checkpoint as a chat model: the same weights, the chat template installed in
    its tokenizer and <|im_end|> added to generation_config's eos ids.

    A copy (weights hard-linked when the filesystem allows) under
    `<workdir>/sft_data/start-<weights sha>`: the pretrain stage's own checkpoint is never
    edited. Every SFT checkpoint copies this tokenizer and generation config."""
    src = Path(checkpoint)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"SFT start checkpoint {src} is not a checkpoint directory (no config.json)")
    sha = (read_meta(src).weight_sha256 if (src / META_FILE).is_file() else None) or weights_sha256(src)
    out = step_dir(Path(workdir) / "sft_data", "start", {"version": SFT_DATA_VERSION}, [sha])
    reused = (out / "config.json").is_file()
    if not reused:
        with building(out) as tmp:
            make_chat_start(src, tmp)
    meta = read_meta(out) if (out / META_FILE).is_file() else None
    ref = CheckpointRef(path=str(out), step=meta.step if meta else 0, tokens_seen=meta.tokens_seen if meta else 0,
                        sha256=sha)
    return cached(ref, out.name.removeprefix("start-"), f"SFT start checkpoint: reused {out}") if reused else ref


@task(**retrying("sft-blend-pack"))
def blend_pack_task(sub, index: int, curated: CuratedRef, previous: PackedRef | None, tokenizer_dir: str,
                    seed: int, workdir: str, tracker: Tracker | None = None, run_id: str | None = None,
                    switch: SwitchSetting = "auto") -> PackedRef:
    """Sample sub-stage `sub`'s blend (+ its keep_previous share of `previous`), render with the
    chat template (reasoning off through `switch`, the recipe's tokenizer.reasoning_switch) and
    best-fit pack into rows of sub.seq_length tokens; log the report and mixture."""
    tok_digest = tokenizer_digest(tokenizer_dir)
    spec = {"blend": sub.blend, "keep_previous": sub.keep_previous, "seq_length": sub.seq_length, "seed": seed,
            "index": index, "version": SFT_DATA_VERSION, **switch_spec(switch)}
    root = step_dir(Path(workdir) / "sft_data", f"packed-{sub.name}", spec,
                    [curated.digest, previous.digest if previous else "", tok_digest])
    digest = root.name.removeprefix(f"packed-{sub.name}-")
    reused = (root / "report.json").is_file()
    try:
        if not reused:
            with building(root) as tmp:
                blend_and_pack(curated.files, curated.domains, sub.blend, sub.seq_length, pack_seed(seed, index),
                               tokenizer_dir, tmp, previous_sample=previous.sample if previous else None,
                               keep_share=sub.keep_previous, switch=switch)
        doc = json.loads((root / "report.json").read_text())
        ref = PackedRef(root=str(root), rows=str(root / "rows.npz"), sample=str(root / "sample.jsonl"),
                        digest=digest, report=doc["packing"], mixture=doc["mixture"])
        _log_packing(sub.name, ref, doc, tracker, run_id)
        check_enough_packs(ref.report, sub.seq_length, sub.global_batch)
    except SFTDataError as err:
        raise SFTDataError(f"stages.sft sub-stage {sub.name!r}: {err}") from None
    return cached(ref, digest, f"SFT packs of {sub.name}: reused {root}") if reused else ref


def _log_packing(name: str, ref: PackedRef, doc: dict, tracker: Tracker | None, run_id: str | None) -> None:
    r = ref.report
    run_logger().info(
        "sft %s: %d conversations -> %d packs of %d tokens, efficiency %.1f%%, dropped %d, supervised tokens %d; mix %s",
        name, r["conversations"], r["packs"], r["pack_size"], 100 * r["efficiency"], r["dropped"],
        r["supervised_tokens"], ", ".join(f"{k} {v:.2f}" for k, v in ref.mixture.items()))
    if not (tracker and run_id):
        return
    metrics = {f"sft/{name}/pack_efficiency": r["efficiency"], f"sft/{name}/packs": r["packs"],
               f"sft/{name}/dropped": r["dropped"], f"sft/{name}/supervised_tokens": r["supervised_tokens"],
               f"sft/{name}/conversations": r["conversations"], f"sft/{name}/reasoning_off": r["reasoning_off"]}
    metrics.update({f"sft/{name}/mix/{d}": share for d, share in ref.mixture.items()})
    tracker.log_metrics(run_id, [(0, 0, metrics)])
    tracker.log_json(run_id, {**doc, "rows": ref.rows, "digest": ref.digest}, f"data/{name}.json")
