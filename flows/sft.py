"""The SFT stage as a Prefect flow: curate -> blend and pack -> train each sub-stage -> compare with the base.

    sft_flow
      ├─ sft-world, sft-curate          conversations made and cleaned once (content-hashed dirs)
      ├─ sft-start                      the starting checkpoint + chat template, <|im_end|> as eos
      ├─ sft-profile                    lengths, turns, tools, rejects, skew warnings of the curated data
      ├─ sft-blend-pack  (per sub-stage) sample the blend (+ keep_previous), best-fit packs
      ├─ evaluate the base              held-out conversations + eval_suite, at step 0
      └─ per sub-stage: run_stretches   train (PackedData, sft_token | sft_conversation), evaluate,
                                        ask the gate; then evaluate the checkpoint it hands on

MLflow layout (chosen so gates and `stagewise cutoffs` work per sub-stage exactly as for
pretraining): one nested run `sft` per SFT stage, tagged `stagewise.stage=sft` and
`stagewise.substages=<names>`, holding the data (curation report and rejects, packing
efficiency, realised mixture: `sft/curate/...`, `sft/<substage>/...`; the data profile:
`data/profile/...`, artifacts `data_profile/`), the before/after
evaluations (`eval/<task>/<metric>` at step 0 for the base and at the cumulative step after
each sub-stage) and the deltas `sft/<task>/<metric>_delta` (final - base); under it one run
per sub-stage, `sft/<name>`, tagged `stagewise.stage=sft` and `stagewise.substage=<name>`,
holding its training metrics, its evaluations at every gate mark and its gate decisions.
A sub-stage's steps and tokens start at 0 in its own run, so a gate's relative thresholds
read the sub-stage's own start. `stagewise cutoffs --stage sft` replays sub-stage runs
(the stage run holds no gate histories and is skipped).

Each sub-stage trains from the checkpoint the previous one handed on (ModelConfig(from=...)
loads its weights) into its own content-addressed step (`stages/sft-<name>-<hash>`, finish
marker = the checkpoint it handed on and its gate decision). The stage itself is a step over
the start checkpoint, the packed data and the evaluation settings: re-running an unchanged
recipe assembles (reuses) the data, then trains and evaluates nothing. The final checkpoint is
registered with the alias `sft`.

With `engine: megatron` the data path and the evaluations are the same; each sub-stage's training
is one Megatron-Bridge run on its kept conversations as chat rows (engines/megatron/chat_rows.py,
engines/megatron/stage.py's sft_plan: import -> train -> export), adopted as the sub-stage's checkpoint
and scored once (the recipe check refuses max_epochs there, and a gate that evaluates before the
sub-stage's end: one at its end reads the export's evaluation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from prefect import flow, get_run_logger
from pydantic import BaseModel
from transformers import AutoTokenizer

from stagewise.data.config import WORLD_FACTS
from stagewise.data.digest import file_sha256 as file_hash
from stagewise.data.reasoning_switch import SwitchSetting, refuse_without_switch, resolve_switch
from stagewise.data.sft_assembly import pack_seed
from stagewise.data.sources import resolve_path
from stagewise.engines.config import where_free
from stagewise.engines.launch.stage import run_engine, with_engine
from stagewise.engines.megatron.chat_rows import write_chat_rows
from stagewise.engines.megatron.stage import sft_plan
from stagewise.engines.megatron.translate import MLflowTarget, megatron_precision
from stagewise.eval.intervals import gain_fields
from stagewise.eval.metric_names import BOUND_ENDS
from stagewise.eval.plots import before_after_plot
from stagewise.eval.score_memo import ScoreMemo
from stagewise.eval.splits import SPLITS
from stagewise.flows.gate_review import review_text
from stagewise.flows.stage import (
    Signal,
    Stage,
    StageContext,
    Upstream,
    checkpoint_hash,
    finish,
    resume_point,
    reused_result,
    stage_run,
    start_checkpoint,
)
from stagewise.flows.stage_loop import GateFailed, run_stretches
from stagewise.model.config import ModelConfig, MTPConfig, TrainConfig
from stagewise.model.train_spec import PackedData, TrainSpec
from stagewise.recipe import Recipe, SFTStage, SFTSubStage
from stagewise.refs import CheckpointRef, PackedRef, StageResult, StageSummary
from stagewise.store.steps import claim_step, finished, mark_finished, reuse, step_dir, value_of
from stagewise.store.tracking import Tracker
from stagewise.tasks.data_profile import sft_profile_task
from stagewise.tasks.evaluate import gate_task, heldout_task, loss_report_task, suite_task
from stagewise.tasks.sft_data import blend_pack_task, curate_task, sft_start_task, sft_world_task

STAGE = "sft"
SUBSTAGE_TAG = "stagewise.substage"
SUBSTAGES_TAG = "stagewise.substages"
TARGET = "eval/sft_test/exact_match"
DEV_TARGET = "eval/sft_dev/exact_match"
"""The `format` questions' entity count when neither the SFT nor the pretraining world says."""


class SFTInputs(BaseModel):
    """What SFT reads from the recipe: its block, where to start without an upstream stage,
    the model's MTP heads, the eval suites, the pretraining world's entity count and the
    model's reasoning switch."""

    stage: SFTStage
    model_from: str | None = None
    mtp: MTPConfig = MTPConfig()
    suites: dict[str, list[str]] = {}
    world_entities: int = WORLD_FACTS
    reasoning_switch: SwitchSetting = "auto"
    """The recipe's tokenizer.reasoning_switch: how the start checkpoint's template turns reasoning off."""


def select(recipe: Recipe) -> SFTInputs | None:
    if recipe.stages.sft is None:
        return None
    world = recipe.data.world
    return SFTInputs(stage=recipe.stages.sft, model_from=recipe.model.from_, mtp=recipe.model.mtp,
                     suites=recipe.eval, world_entities=world.facts if world else WORLD_FACTS,
                     reasoning_switch=recipe.tokenizer.reasoning_switch)


class Scores:
    """Evaluations of checkpoints, computed once per weights and logged to whichever run asks.

    The held-out conversations are scored per split (eval/splits.py): a sub-stage's marks (its gate's
    evaluations, its end) read dev only; the stage's base checkpoint is scored on test (the closing
    table's "before") and its final one on dev and test (ablations compare dev, the closing table
    reports test). Nothing in between is scored on test. The last evaluation inside a sub-stage and the stage
    run's "after" evaluation score the same weights; the memo (eval/score_memo.py, keyed by weight
    sha256) makes the second one a copy, logged again at the asking run's step."""

    def __init__(self, tracker: Tracker, heldout: str | None, heldout_limit: int | None, pack_size: int,
                 seed: int, device: str = "cpu", switch: SwitchSetting = "auto", drop_reasoning: bool = False):
        self.tracker, self.heldout, self.heldout_limit, self.pack_size = tracker, heldout, heldout_limit, pack_size
        self.seed, self.device, self.switch, self.drop_reasoning = seed, device, switch, drop_reasoning
        self.memo = ScoreMemo()  # in memory: heldout_task logs its own artifacts the first time
        self.items: dict[str, dict[str, dict[str, float]]] = {}
        """weights (sha256, else path) -> metric -> each conversation's score (the closing table's interval)"""

    def __call__(self, ckpt: CheckpointRef, tasks: list[str] | None, limit: int | None, run_id: str,
                 at: tuple[int, int] | None = None, splits: tuple[str, ...] = SPLITS) -> dict[str, float]:
        """Score `ckpt` (held-out conversations of `splits` + `tasks`) and log to `run_id` at `at` = (step, tokens)."""
        ref = ckpt if at is None else ckpt.model_copy(update={"step": at[0], "tokens_seen": at[1]})
        metrics: dict[str, float] = {}
        weights = ckpt.sha256 or ckpt.path
        for split in splits if self.heldout else ():
            scored, remembered = self.memo.get("sft-heldout", [weights, split, self.heldout_limit],
                                               lambda: heldout_task(ref, self.heldout, split, self.seed, self.pack_size,
                                                                    self.heldout_limit, self.tracker, run_id,
                                                                    device=self.device, switch=self.switch,
                                                                    drop_reasoning=self.drop_reasoning))
            if remembered is not None:
                self.tracker.log_metrics(run_id, [(ref.step, ref.tokens_seen, scored.metrics)])
            metrics |= scored.metrics
            self.items.setdefault(weights, {}).update(scored.items)
        if tasks:
            metrics |= self._once("sft-suite", [ckpt.sha256 or ckpt.path, list(tasks), limit], ref, run_id,
                                  lambda: suite_task(ref, tasks, limit, self.tracker, run_id, device=self.device))
        return metrics

    def _once(self, kind: str, spec: list, ref: CheckpointRef, run_id: str,
              compute: Callable[[], dict]) -> dict[str, float]:
        metrics, remembered = self.memo.get(kind, spec, compute)
        if remembered is not None:
            self.tracker.log_metrics(run_id, [(ref.step, ref.tokens_seen, metrics)])
        return metrics


COUNTS = ("answered", "supervised_tokens")
"""Held-out metrics that count items rather than score them: no delta."""
NOT_SCORES = COUNTS + BOUND_ENDS
"""Held-out metrics with no delta and no place in the before/after table: counts, interval bounds."""


def deltas(base: dict[str, float], final: dict[str, float]) -> dict[str, float]:
    """`sft/<task>/<metric>_delta` = final - base for every `eval/<task>/<metric>` both have (scores, not counts)."""
    return {f"sft/{k.removeprefix('eval/')}_delta": final[k] - base[k] for k in sorted(base)
            if k in final and not k.endswith(NOT_SCORES)}


def substage_spec(sub: SFTSubStage, train: TrainConfig, mtp: MTPConfig, suite: list[str] | None,
                  heldout_limit: int | None, seed: int) -> dict:
    """What determines a sub-stage's weights and the checkpoint it hands on (hashed with its start
    checkpoint and packed data): a gate decides which checkpoint is handed on, from what it evaluates."""
    gate = sub.gate
    return {"train": train, "normalization": sub.normalization, "lora": sub.lora, "max_epochs": sub.max_epochs,
            "mtp": mtp, "seed": seed, "gate": [gate, suite, heldout_limit] if gate else None}


def train_substage(ctx: StageContext, sub: SFTSubStage, index: int, packed: PackedRef, start: CheckpointRef,
                   block: SFTInputs, tokenizer_dir: str, scores: Scores,
                   parent_run_id: str) -> tuple[CheckpointRef, dict | None]:
    """One sub-stage in its own MLflow run: train from `start` in stretches (or launched); returns
    (handed on, decision)."""
    logger = get_run_logger()
    tracker, kind = ctx.tracker, f"{STAGE}-{sub.name}"
    sub_ctx = ctx.model_copy(update={"parent_run_id": parent_run_id})
    launched = block.stage.engine != "torch"
    with stage_run(sub_ctx, f"{STAGE}/{sub.name}", {SUBSTAGE_TAG: sub.name}) as run_id:
        train_cfg = TrainConfig.model_validate(sub.model_dump(include=set(TrainConfig.model_fields)))
        precision = megatron_precision if launched else ctx.runtime.precision_for
        train_cfg = train_cfg.model_copy(update={"precision": precision(train_cfg.precision)})
        gate = sub.gate
        suite = block.suites.get(gate.suite if gate else sub.eval_suite) if (gate or sub.eval_suite) else None
        spec = with_engine(substage_spec(sub, train_cfg, block.mtp, suite, scores.heldout_limit, ctx.seed), block.stage)
        out_dir = step_dir(ctx.stages_root, kind, spec, [start.sha256 or start.path, packed.digest])
        tracker.set_tags(run_id, {"stagewise.stage_dir": str(out_dir), "stagewise.start_checkpoint": start.path})
        claim_step(kind, out_dir, run_id)  # waits while another live run builds this sub-stage
        record = finished(out_dir)
        if record is not None and Path(record["checkpoint"]["path"]).is_dir():
            record = reuse(kind, out_dir, record)
            logger.info("sft %s already finished in %s: reusing it", sub.name, out_dir)
            tracker.set_tags(run_id, {"stagewise.reused": "true"})
            return CheckpointRef.model_validate(record["checkpoint"]), record.get("decision")
        limit = gate.eval_limit if gate else block.stage.eval_limit
        evaluate = lambda ckpt: scores(ckpt, suite, limit, run_id, splits=("dev",))  # noqa: E731 - gates read dev
        if launched:  # one launch, then the evaluation of its export; a gate only at its end (the recipe check)
            if gate is not None and gate.reads_start():  # the start, for relative thresholds, guards, patience
                evaluate(start.model_copy(update={"step": 0, "tokens_seen": 0}))
            ckpt = _substage_on_megatron(ctx, sub, train_cfg, index, packed, start, block, tokenizer_dir, run_id,
                                         out_dir)
            evaluate(ckpt)
            decision = gate_task(gate, tracker, run_id, ckpt.tokens_seen, True) if gate is not None else None
            if decision is not None and decision["action"] == "fail":
                raise GateFailed(f"{STAGE}/{sub.name}", decision)
            mark_finished(out_dir, {"checkpoint": ckpt.model_dump(), "decision": decision, "run_id": run_id})
            return ckpt, decision
        spec = TrainSpec(
            stage=STAGE, model=ModelConfig(preset=None, from_=start.path, mtp=block.mtp), train=train_cfg,
            objective=f"sft_{sub.normalization}", out_dir=str(out_dir), seed=ctx.seed, recipe_hash=ctx.recipe_hash,
            parent=start.path, device=ctx.runtime.device, lora=sub.lora,
            data=PackedData(rows=packed.rows, tokenizer_dir=tokenizer_dir, max_epochs=sub.max_epochs),
        )
        total = train_cfg.total_steps * train_cfg.tokens_per_step
        try:
            ckpt, decision = run_stretches(spec, [(sub.name, total)], total, resume_point(out_dir, ctx.resume),
                                           evaluate, tracker, run_id, gate, name=f"{STAGE}/{sub.name}")
        except GateFailed as e:
            raise GateFailed(f"{STAGE}/{sub.name}", e.decision) from None
        if decision is not None:
            tracker.set_tags(run_id, {"stagewise.handed_on": ckpt.path})
        loss_report_task(tracker, run_id, f"{STAGE}_{sub.name}")
        mark_finished(out_dir, {"checkpoint": ckpt.model_dump(), "decision": decision, "run_id": run_id})
    return ckpt, decision


def _substage_on_megatron(ctx: StageContext, sub: SFTSubStage, train_cfg: TrainConfig, index: int, packed: PackedRef,
                          start: CheckpointRef, block: SFTInputs, tokenizer_dir: str, run_id: str,
                          out_dir: Path) -> CheckpointRef:
    """One sub-stage trained by Megatron-Bridge: the conversations our packer kept, as chat rows
    (engines/megatron/chat_rows.py), then import -> train -> export (engines/megatron/stage.py), adopted."""
    stage = block.stage
    rows = out_dir / "megatron-data"
    report = write_chat_rows(packed.sample, tokenizer_dir, sub.seq_length, sub.blend.reasoning_off_fraction,
                             pack_seed(ctx.seed, index), rows, switch=block.reasoning_switch)
    get_run_logger().info("sft %s: %d conversations as Megatron-Bridge chat rows in %s (%d longer than a pack "
                          "left out, %d with reasoning off)", sub.name, report["conversations"], rows,
                          report["dropped"], report["reasoning_off"])
    mlflow = MLflowTarget(ctx.tracker.uri, ctx.tracker.experiment, run_id, f"{STAGE}/{sub.name}")
    plan = sft_plan(sub.model_copy(update={"precision": train_cfg.precision}),
                    ModelConfig(preset=None, from_=start.path, mtp=block.mtp), stage.launch, start.path, tokenizer_dir,
                    rows, out_dir, ctx.seed, mlflow, field=f"stages.{STAGE}.stages[{index}]")
    return run_engine(ctx, STAGE, stage.engine, stage.launch, run_id, out_dir, plan, parent=start.path,
                      tokenizer_dir=tokenizer_dir)


def sft_spec(block: SFTInputs, packs: list[PackedRef], heldout: str | None, seed: int) -> dict:
    """What determines the stage's outcome (hashed with the start checkpoint, the packs and the held-out file)."""
    return {"stage": where_free(block.stage), "mtp": block.mtp, "seed": seed, "packs": [p.digest for p in packs],
            "suite": block.suites.get(block.stage.eval_suite or ""),
            "substage_suites": {s.name: block.suites.get((s.gate.suite if s.gate else s.eval_suite) or "")
                                for s in block.stage.stages},
            "heldout": file_hash(heldout) if heldout else None}


@flow(name="sft")
def sft_flow(ctx: StageContext, block: SFTInputs, upstream: Upstream | None = None) -> StageResult:
    """Supervised fine-tuning through the sub-stages of `block.stage` (a `stages.sft` block), from
    the checkpoint the previous stage handed on, else `model.from`."""
    logger = get_run_logger()
    stage, tracker, workdir = block.stage, ctx.tracker, ctx.workdir
    start_from = start_checkpoint(upstream or Upstream(), block.model_from)
    names = [s.name for s in stage.stages]
    with stage_run(ctx, STAGE, {SUBSTAGES_TAG: ",".join(names), "stagewise.start_checkpoint": start_from}) as run_id:
        data = stage.data
        world_dir = None
        if data.world is not None:
            world_dir = value_of(sft_world_task(data.world, data.world.entities or block.world_entities, ctx.seed,
                                                workdir))
        curated = value_of(curate_task(data.sources, data.curate, world_dir, ctx.base_dir, workdir, tracker, run_id,
                                       data.reasoning_content))
        start = value_of(sft_start_task(start_from, workdir))
        _refuse_without_switch(start.path, block)
        value_of(sft_profile_task(curated, data.sources, stage.stages, data.curate, start.path, workdir, tracker, run_id))
        packs, previous = [], None
        for i, sub in enumerate(stage.stages):
            previous = value_of(blend_pack_task(sub, i, curated, previous, start.path, ctx.seed, workdir, tracker,
                                                run_id, block.reasoning_switch))
            packs.append(previous)
        heldout = data.heldout or ("@world/sft_eval.jsonl" if world_dir else None)
        heldout_path = str(resolve_path(heldout, ctx.base_dir, world_dir)) if heldout else None
        out_dir = step_dir(ctx.stages_root, STAGE, sft_spec(block, packs, heldout_path, ctx.seed),
                           [checkpoint_hash(start_from)])
        reused = reused_result(ctx, STAGE, run_id, out_dir)
        if reused is not None:
            logger.info("sft already finished in %s: reusing %s", out_dir, reused.checkpoint)
            return reused
        scores = Scores(tracker, heldout_path, data.heldout_limit, max(s.seq_length for s in stage.stages), ctx.seed,
                        ctx.runtime.device, block.reasoning_switch, data.reasoning_content == "drop")
        tasks = block.suites.get(stage.eval_suite) if stage.eval_suite else None
        # the start on test (the closing table's "before") and the suite; dev only where it is read:
        # the gates' marks and the stage's end (what ablations compare)
        base = scores(start, tasks, stage.eval_limit, run_id, at=(0, 0), splits=("test",))
        ckpt, step, tokens, decisions = start, 0, 0, {}
        for i, (sub, packed) in enumerate(zip(stage.stages, packs)):
            ckpt, decision = train_substage(ctx, sub, i, packed, ckpt, block, start.path, scores, run_id)
            if decision is not None:
                decisions[sub.name] = decision
            step, tokens = step + ckpt.step, tokens + ckpt.tokens_seen
        final = scores(ckpt, tasks, stage.eval_limit, run_id, at=(step, tokens)) if stage.stages else base
        delta = deltas(base, final)
        tracker.log_metrics(run_id, [(step, tokens, delta)])
        logger.info("sft: %s", ", ".join(f"{k} {v:+.3f}" for k, v in delta.items()) or "no evaluations")
        _report(tracker, run_id, base, final, names)
        gate = None
        if decisions:
            last = list(decisions)[-1]
            gate = {**decisions[last], "substage": last}
        headline = {**final, **{f"base/{k}": v for k, v in base.items()}, **delta}
        budgets = {s.name: s.tokens for s in stage.stages}
        summary = StageSummary(metric=TARGET, before=base.get(TARGET), after=final.get(TARGET), higher_is_better=True,
                               tokens=tokens, dev_metric=DEV_TARGET,
                               **gain_fields(scores.items.get(start.sha256 or start.path, {}).get(TARGET),
                                             scores.items.get(ckpt.sha256 or ckpt.path, {}).get(TARGET), True),
                               note="; ".join(gate_note(n, d, budgets[n]) for n, d in decisions.items()) or None)
        result = StageResult(stage=STAGE, parent=start_from, checkpoint=ckpt.path, run_id=run_id, gate=gate,
                             metrics=headline, stage_dir=str(out_dir), summary=summary)
        return finish(ctx, out_dir, result, {**final, **delta}, at=(step, tokens))


def gate_note(substage: str, decision: dict, budget: int) -> str:
    """What a sub-stage's gate decided, for the closing table's row: e.g. `stage1 gate: stop at 614,400
    of 983,040 tokens (rule held)`."""
    reason = decision.get("reason", "")
    why = ("rule held" if decision.get("held") else "plateau" if reason.startswith("plateau")
           else "budget exhausted, rule not held" if decision.get("undecided") or reason.startswith("budget")
           else reason[:60])
    reviewed = f"; {review_text(decision['review'])}" if decision.get("review") else ""
    return f"{substage} gate: {decision['action']} at {decision['tokens_seen']:,} of {budget:,} tokens ({why}{reviewed})"


def _refuse_without_switch(start: str, block: SFTInputs) -> None:
    """BadInput naming tokenizer.reasoning_switch when a sub-stage asks for reasoning-off conversations
    and the start checkpoint's template has no switch: known once its tokenizer is, before any packing."""
    fractions = {f"stages.{STAGE}.stages[{i}].blend.reasoning_off_fraction": sub.blend.reasoning_off_fraction
                 for i, sub in enumerate(block.stage.stages)}
    if not any(fractions.values()):
        return


    refuse_without_switch(resolve_switch(AutoTokenizer.from_pretrained(start), block.reasoning_switch), fractions,
                          f"the SFT start checkpoint {start}")


def _report(tracker: Tracker, run_id: str, base: dict, final: dict, names: list[str]) -> None:
    """The before/after table (JSON) and picture (PNG) of the stage's evaluations (scores, not bounds)."""
    base = {k: v for k, v in base.items() if not k.endswith(BOUND_ENDS)}
    table = {k: {"base": base[k], "sft": final.get(k), "delta": final[k] - base[k] if k in final else None} for k in base}
    tracker.log_json(run_id, {"substages": names, "metrics": table}, "reports/sft_before_after.json")
    if table:
        shown = {k: v for k, v in final.items() if not k.endswith(BOUND_ENDS)}
        tracker.log_figure(run_id, before_after_plot(base, shown, "SFT: base vs fine-tuned"), "reports/sft_before_after.png")


STAGE_ENTRY = Stage(name=STAGE, flow=sft_flow, select=select, start="handed_on",
                    signals=(Signal("training loss per sub-stage", ("train/lm_loss",), nested=True),))
