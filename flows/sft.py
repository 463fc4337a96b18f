"""The SFT stage as a Prefect flow: curate -> blend and pack -> train each sub-stage -> compare with the base.

    sft_flow
      ├─ sft-world, sft-curate          conversations made and cleaned once (content-hashed dirs)
      ├─ sft-start                      the starting checkpoint + chat template, <|im_end|> as eos
      ├─ sft-blend-pack  (per sub-stage) sample the blend (+ keep_previous), best-fit packs
      ├─ evaluate the base              held-out conversations + eval_suite, at step 0
      └─ per sub-stage: run_stretches   train (PackedData, sft_token | sft_conversation), evaluate,
                                        ask the gate; then evaluate the checkpoint it hands on

MLflow layout (chosen so gates and `stagewise cutoffs` work per sub-stage exactly as for
pretraining): one nested run `sft` per SFT stage, tagged `stagewise.stage=sft` and
`stagewise.substages=<names>`, holding the data (curation report and rejects, packing
efficiency, realised mixture: `sft/curate/...`, `sft/<substage>/...`), the before/after
evaluations (`eval/<task>/<metric>` at step 0 for the base and at the cumulative step after
each sub-stage) and the deltas `sft/<task>/<metric>_delta` (final - base); under it one run
per sub-stage, `sft/<name>`, tagged `stagewise.stage=sft` and `stagewise.substage=<name>`,
holding its training metrics, its evaluations at every gate mark and its gate decisions.
A sub-stage's steps and tokens start at 0 in its own run, so a gate's relative thresholds
read the sub-stage's own start. `stagewise cutoffs --stage sft` replays sub-stage runs
(the stage run holds no gate histories and is skipped).

Each sub-stage trains from the checkpoint the previous one handed on (ModelConfig(from=...)
loads its weights) into its own directory named by a hash of what determines its weights;
a finished sub-stage leaves `handed_on.json` there, so re-running an unchanged recipe trains
nothing. The final checkpoint is registered with the alias `sft`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from prefect import flow, get_run_logger

from flows.pretrain import existing_checkpoint, stage_dir
from flows.recipe import SFTStage, SFTSubStage
from flows.stage_loop import GateFailed, run_stretches
from model.config import ModelConfig, TrainConfig
from tasks.evaluate import heldout_task, loss_report_task, suite_task
from tasks.refs import CheckpointRef, StageResult
from tasks.sft_data import PackedRef, blend_pack_task, curate_task, resolve, sft_start_task, sft_world_task
from tasks.tracking import STAGE_TAG, Tracker
from tasks.train import PackedData, TrainSpec

STAGE = "sft"
SUBSTAGE_TAG = "stagewise.substage"
SUBSTAGES_TAG = "stagewise.substages"
HANDED_ON = "handed_on.json"
"""Written into a sub-stage's directory when it finishes: the checkpoint it handed on and its gate decision."""


NO_START = ("stages.sft needs a checkpoint to start from: run it after pretraining (--stages pretrain,sft; "
            "a finished, unchanged pretrain stage is reused without training) or set model.from to a checkpoint directory")


class SFTStartError(ValueError):
    """The SFT stage has no checkpoint to start from."""


def start_checkpoint(previous: list[StageResult], model_from: str | None) -> str:
    """What SFT fine-tunes: the checkpoint the previous stage handed on, else `model.from`."""
    if previous:
        return previous[-1].checkpoint
    if model_from:
        return model_from
    raise SFTStartError(NO_START)


class Scores:
    """Evaluations of checkpoints, computed once per weights and logged to whichever run asks.

    The last evaluation inside a sub-stage and the stage run's "after" evaluation score the
    same weights; the cache (keyed by weight sha256) makes the second one a copy."""

    def __init__(self, tracker: Tracker, heldout: str | None, heldout_limit: int | None, pack_size: int):
        self.tracker, self.heldout, self.heldout_limit, self.pack_size = tracker, heldout, heldout_limit, pack_size
        self.cache: dict[tuple, dict[str, float]] = {}

    def __call__(self, ckpt: CheckpointRef, tasks: list[str] | None, limit: int | None, run_id: str,
                 at: tuple[int, int] | None = None) -> dict[str, float]:
        """Score `ckpt` (held-out conversations + `tasks`) and log to `run_id` at `at` = (step, tokens)."""
        ref = ckpt if at is None else ckpt.model_copy(update={"step": at[0], "tokens_seen": at[1]})
        metrics: dict[str, float] = {}
        if self.heldout:
            metrics |= self._once((ckpt.sha256 or ckpt.path, "heldout", self.heldout_limit), ref, run_id,
                                  lambda: heldout_task(ref, self.heldout, self.pack_size, self.heldout_limit,
                                                       self.tracker, run_id))
        if tasks:
            metrics |= self._once((ckpt.sha256 or ckpt.path, "suite", tuple(tasks), limit), ref, run_id,
                                  lambda: suite_task(ref, tasks, limit, self.tracker, run_id))
        return metrics

    def _once(self, key: tuple, ref: CheckpointRef, run_id: str, compute: Callable[[], dict]) -> dict[str, float]:
        if key in self.cache:
            self.tracker.log_metrics(run_id, [(ref.step, ref.tokens_seen, self.cache[key])])
        else:
            self.cache[key] = compute()
        return self.cache[key]


COUNTS = ("answered", "supervised_tokens")
"""Held-out metrics that count items rather than score them: no delta."""


def deltas(base: dict[str, float], final: dict[str, float]) -> dict[str, float]:
    """`sft/<task>/<metric>_delta` = final - base for every `eval/<task>/<metric>` both have (scores, not counts)."""
    return {f"sft/{k.removeprefix('eval/')}_delta": final[k] - base[k] for k in sorted(base)
            if k in final and not k.endswith(COUNTS)}


def _finished(out_dir: Path) -> tuple[CheckpointRef, dict | None] | None:
    """The handed-on checkpoint and decision of a finished sub-stage directory, if it still exists."""
    import json

    path = out_dir / HANDED_ON
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    ref = CheckpointRef.model_validate(doc["checkpoint"])
    return (ref, doc.get("decision")) if Path(ref.path).is_dir() else None


def _write_handed_on(out_dir: Path, ref: CheckpointRef, decision: dict | None) -> None:
    import json
    import os

    tmp = out_dir / f".{HANDED_ON}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({"checkpoint": ref.model_dump(), "decision": decision}, indent=1, default=str))
    os.replace(tmp, out_dir / HANDED_ON)


def train_substage(sub: SFTSubStage, packed: PackedRef, start: CheckpointRef, model: ModelConfig,
                   tokenizer_dir: str, scores: Scores, suites: dict[str, list[str]], eval_limit: int | None,
                   workdir: str, seed: int, recipe_hash: str, tracker: Tracker, parent_run_id: str,
                   resume: bool, device: str) -> tuple[CheckpointRef, dict | None]:
    """One sub-stage in its own MLflow run: train from `start` in stretches; returns (handed on, decision)."""
    logger = get_run_logger()
    with tracker.run(f"{STAGE}/{sub.name}", {STAGE_TAG: STAGE, SUBSTAGE_TAG: sub.name}, parent_run_id) as run_id:
        train_cfg = TrainConfig.model_validate(sub.model_dump(include=set(TrainConfig.model_fields)))
        net = ModelConfig(preset=None, from_=start.path, mtp=model.mtp)
        gate = sub.gate
        suite = suites.get(gate.suite if gate else sub.eval_suite) if (gate or sub.eval_suite) else None
        # A gate decides which checkpoint is handed on, from what it evaluates: both are in the name.
        out_dir = stage_dir(Path(workdir), f"{STAGE}-{sub.name}", {
            "start": start.sha256 or start.path, "train": train_cfg.model_dump(), "normalization": sub.normalization,
            "lora": sub.lora.model_dump() if sub.lora else None, "max_epochs": sub.max_epochs,
            "mtp": model.mtp.model_dump(), "data": packed.digest, "seed": seed,
            "gate": ([gate.model_dump(), suite, scores.heldout_limit] if gate else None),
        })
        tracker.set_tags(run_id, {"stagewise.stage_dir": str(out_dir), "stagewise.start_checkpoint": start.path})
        done = _finished(out_dir)
        if done is not None:
            logger.info("sft %s already finished at %s: reusing it", sub.name, done[0].path)
            tracker.set_tags(run_id, {"stagewise.reused": "true"})
            return done
        spec = TrainSpec(
            stage=STAGE, model=net, train=train_cfg, objective=f"sft_{sub.normalization}", out_dir=str(out_dir),
            seed=seed, recipe_hash=recipe_hash, parent=start.path, device=device,
            data=PackedData(rows=packed.rows, tokenizer_dir=tokenizer_dir, max_epochs=sub.max_epochs), lora=sub.lora,
        )
        total = train_cfg.total_steps * train_cfg.tokens_per_step
        resume_from = existing_checkpoint(out_dir, total, resume)
        limit = gate.eval_limit if gate else eval_limit
        evaluate = lambda ckpt: scores(ckpt, suite, limit, run_id)  # noqa: E731
        try:
            ckpt, decision = run_stretches(spec, [(sub.name, total)], total, resume_from, evaluate, tracker, run_id, gate)
        except GateFailed as e:
            raise GateFailed(f"{STAGE}/{sub.name}", e.decision) from None
        if decision is not None:
            tracker.set_tags(run_id, {"stagewise.handed_on": ckpt.path})
        loss_report_task(tracker, run_id, f"{STAGE}_{sub.name}")
        _write_handed_on(out_dir, ckpt, decision)
    return ckpt, decision


@flow(name="sft", log_prints=True)
def sft_flow(
    stage: SFTStage,
    model: ModelConfig,
    start_from: str,
    suites: dict[str, list[str]],
    workdir: str,
    base_dir: str,
    seed: int,
    recipe_hash: str,
    tracker: Tracker,
    parent_run_id: str | None = None,
    resume: bool = False,
    device: str = "cpu",
    world_entities: int = 3000,
) -> StageResult:
    """Supervised fine-tuning of the checkpoint `start_from` through the sub-stages of `stage` (a `stages.sft` block).

    `model` contributes its `mtp` settings only (the weights come from `start_from`);
    `world_entities` is the pretraining world's entity count (stage.data.world.entities wins)."""
    logger = get_run_logger()
    names = [s.name for s in stage.stages]
    with tracker.run(STAGE, {STAGE_TAG: STAGE, SUBSTAGES_TAG: ",".join(names)}, parent_run_id) as run_id:
        data = stage.data
        world_dir = None
        if data.world is not None:
            world_dir = sft_world_task(data.world, data.world.entities or world_entities, seed, workdir)
        curated = curate_task(data.sources, data.curate, world_dir, base_dir, workdir, tracker, run_id)
        start = sft_start_task(start_from, workdir)
        tracker.set_tags(run_id, {"stagewise.start_checkpoint": start_from})
        packs, previous = [], None
        for i, sub in enumerate(stage.stages):
            previous = blend_pack_task(sub, i, curated, previous, start.path, seed, workdir, tracker, run_id)
            packs.append(previous)
        heldout = data.heldout or ("@world/sft_eval.jsonl" if world_dir else None)
        heldout_path = str(resolve(heldout, base_dir, world_dir)) if heldout else None
        scores = Scores(tracker, heldout_path, data.heldout_limit, max(s.seq_length for s in stage.stages))
        tasks = suites.get(stage.eval_suite) if stage.eval_suite else None
        base = scores(start, tasks, stage.eval_limit, run_id, at=(0, 0))
        ckpt, step, tokens, decisions = start, 0, 0, {}
        final = base
        for sub, packed in zip(stage.stages, packs):
            ckpt, decision = train_substage(sub, packed, ckpt, model, start.path, scores, suites, stage.eval_limit,
                                            workdir, seed, recipe_hash, tracker, run_id, resume, device)
            if decision is not None:
                decisions[sub.name] = decision
            step, tokens = step + ckpt.step, tokens + ckpt.tokens_seen
            final = scores(ckpt, tasks, stage.eval_limit, run_id, at=(step, tokens))
        delta = deltas(base, final)
        tracker.log_metrics(run_id, [(step, tokens, delta)])
        logger.info("sft: %s", ", ".join(f"{k} {v:+.3f}" for k, v in delta.items()) or "no evaluations")
        _report(tracker, run_id, base, final, names)
        tracker.register_checkpoint(tracker.experiment, Path(ckpt.path), run_id, alias=STAGE)
    gate = None
    if decisions:
        last = list(decisions)[-1]
        gate = {**decisions[last], "substage": last}
    headline = {**{k: v for k, v in final.items()}, **{f"base/{k}": v for k, v in base.items()}, **delta}
    return StageResult(stage=STAGE, checkpoint=ckpt.path, run_id=run_id, gate=gate, metrics=headline)


def _report(tracker: Tracker, run_id: str, base: dict, final: dict, names: list[str]) -> None:
    """The before/after table (JSON) and picture (PNG) of the stage's evaluations."""
    table = {k: {"base": base[k], "sft": final.get(k), "delta": final[k] - base[k] if k in final else None} for k in base}
    tracker.log_json(run_id, {"substages": names, "metrics": table}, "reports/sft_before_after.json")
    if table:
        from eval.plots import before_after_plot

        tracker.log_figure(run_id, before_after_plot(base, final, "SFT: base vs fine-tuned"), "reports/sft_before_after.png")
