"""The distillation stage as a Prefect flow: multi-teacher on-policy distillation (MOPD).

    distill_flow
      ├─ teachers (per round)   a checkpoint, an earlier stage's output, or an RL run trained here
      │                         from the student's start on the teacher's domains (a nested `rl`
      │                         flow: its own MLflow run distill-teacher-<name>, its own step)
      ├─ tokenizer check        teachers and student must tokenize alike (exit 2 naming the files)
      ├─ held-out before        student pass@1 per domain; each teacher on its own domains
      ├─ distill/round-<r>      the student samples, each sample's teacher scores its tokens, the
      │                         engine trains GRPO's loss on per-token advantages log π_T - log π_S
      │                         (model/distill_batches.py); one-step off-policy, exact resume
      └─ held-out after         student pass@1, the share of each teacher's gain recovered, and the
                                eval suite's retention

MLflow: a run `distill` with `distill/<split>/student/pass_at_1/<domain>` for the dev and test
splits of the held-out prompts (eval/splits.py; step 0 = the start, step r = after round r),
`distill/test/teacher/pass_at_1/<domain>` (step r: round r's teachers, on test only: what the
recovered share is computed on), `distill/recovered/<domain>`, `distill/chat/...` and `distill/retained`; a nested
run per round with per-step `distill/reverse_kl/<domain>`, `distill/logprob_gap/<domain>`,
`distill/train_accuracy/<domain>`, the clip and masked-IS fractions, tokens/s. Every round and
every teacher is a content-addressed step: an unchanged recipe reuses them. The run's tags
`stagewise.teacher.<name>[.round<r>]` name each teacher's checkpoint. The final student is
registered with the alias `distill`.

With `engine: nemo_rl` each round's training is NeMo RL's MOPD (engines/nemo_rl/stage.py): the
round's prompts in our sampler's order, its teachers by HF directory, NeMo RL's converter, the
export adopted as the round's checkpoint; teachers and evaluations are the same.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from pydantic import BaseModel
from transformers import AutoTokenizer

from stagewise.data.chat import install_chat_template, load_chat_tokenizer
from stagewise.data.config import WORLD_FACTS
from stagewise.data.errors import BadInput
from stagewise.data.reasoning_switch import SwitchSetting, switch_spec
from stagewise.data.rl_sampler import CurriculumSampler
from stagewise.data.tokenizer_match import check_same_tokenizer
from stagewise.engines.launch.stage import run_engine
from stagewise.engines.nemo_rl.stage import (
    distill_plan,
    gym_environments,
    mlflow_target,
    refuse_unsupported,
    row_agents,
)
from stagewise.engines.nemo_rl.translate import unsupported_distill
from stagewise.eval.heldout import end_ids, round_robin
from stagewise.eval.intervals import gain_fields
from stagewise.eval.plots import before_after_plot, distill_plot
from stagewise.eval.rewards import RewardConfig
from stagewise.eval.rl_wiring import RLWiring
from stagewise.eval.score_memo import ScoreMemo
from stagewise.flows.rl import RLInputs, StageRows, refuse_backend, rl_flow, rl_metric_log, stage_generator, stage_rows
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
from stagewise.model.build import load_model
from stagewise.model.checkpoint import read_meta
from stagewise.model.distill_batches import DistillBatches
from stagewise.model.objectives.grpo import GRPOObjective
from stagewise.model.rollout.hf import HFGenerator
from stagewise.model.teachers import TeacherRouter, make_teacher
from stagewise.model.train_spec import make_trainer
from stagewise.recipe import Recipe
from stagewise.recipe.blocks.distill import DistillStage, TeacherSpec, teacher_rl_block
from stagewise.recipe.blocks.on_policy import block_spec
from stagewise.recipe.blocks.rl import RLData, RLStage
from stagewise.refs import CheckpointRef, StageResult, StageSummary
from stagewise.store.policy import run_logger
from stagewise.store.steps import step_dir, value_of
from stagewise.tasks.evaluate import suite_task
from stagewise.tasks.rl import heldout_eval_task, rl_train_task

STAGE = "distill"
TARGET = "distill/test/student/pass_at_1/all"
DEV_TARGET = "distill/dev/student/pass_at_1/all"
DISTILL_VERSION = 1
"""Bump when what the stage computes changes for the same recipe: finished steps then retrain."""


class DistillInputs(BaseModel):
    """What distillation reads from the recipe: its block, the RL block its `rl` teachers start
    from, where to start without an upstream stage, the eval suites, the world's entity count."""

    stage: DistillStage
    data: RLData
    """The prompts: the block's own data, else stages.rl's."""
    rl: RLStage | None = None
    model_from: str | None = None
    suites: dict[str, list[str]] = {}
    world_entities: int = WORLD_FACTS
    reasoning_switch: SwitchSetting = "auto"
    """The recipe's tokenizer.reasoning_switch: how the prompts say `reasoning` to the student and teachers."""


def select(recipe: Recipe) -> DistillInputs | None:
    if recipe.stages.distill is None:
        return None
    world = recipe.data.world
    d = recipe.stages.distill
    return DistillInputs(stage=d, data=d.data or recipe.stages.rl.data, rl=recipe.stages.rl,
                         model_from=recipe.model.from_,
                         suites=recipe.eval, world_entities=world.facts if world else WORLD_FACTS,
                         reasoning_switch=recipe.tokenizer.reasoning_switch)


def student_start(block: DistillInputs, upstream: Upstream, base_dir: str) -> str:
    """The student's first checkpoint: the one handed on, a named earlier stage's, or a directory."""
    named = block.stage.student
    if named is None:
        return start_checkpoint(upstream, block.model_from)
    result = upstream.of(named)
    if result is not None:
        return result.checkpoint
    path = Path(named) if Path(named).is_absolute() else Path(base_dir) / named
    if path.is_dir():
        return str(path)

    raise BadInput(f"stages.distill.student: {named!r} is neither a stage that ran before distill in this run "
                   f"nor a checkpoint directory (looked for {path})")


@flow(name="distill")
def distill_flow(ctx: StageContext, block: DistillInputs, upstream: Upstream | None = None) -> StageResult:
    """On-policy distillation of the student from per-domain teachers, per `stages.distill`."""
    upstream = upstream or Upstream()
    cfg, tracker, log = block.stage, ctx.tracker, run_logger()
    start = student_start(block, upstream, ctx.base_dir)
    with stage_run(ctx, STAGE, {"stagewise.start_checkpoint": start}) as run_id:
        rows = stage_rows(ctx, block.data, block.world_entities, None, STAGE)
        fixed = [_fixed_teacher(t, upstream, ctx.base_dir) for t in cfg.teachers if t.rl is None]
        spec = {"stage": block_spec(cfg, {"vllm_url", "vllm_weight_sync", "data"}), "data": block.data.model_dump(),
                "rl": block_spec(block.rl, set()) if block.rl else None, "suite": block.suites.get(cfg.eval_suite or ""),
                "seed": ctx.seed, "version": DISTILL_VERSION} | switch_spec(block.reasoning_switch)
        out_dir = step_dir(ctx.stages_root, STAGE, spec, [checkpoint_hash(start), *rows.hashes(),
                                                          *(checkpoint_hash(p) for p in fixed)])
        reused = reused_result(ctx, STAGE, run_id, out_dir)
        if reused is not None:
            return reused
        teacher_ctx = ctx.model_copy(update={"parent_run_id": run_id})
        evaluator = _Evaluator(ctx, block, rows, run_id)
        if cfg.engine == "nemo_rl":  # refused before any teacher trains: what only the rows tell
            _refuse_on_nemo_rl(cfg, rows, evaluator.wiring(start))
        # the start on test (the closing table's "before"); after each round both splits (ablations read dev)
        student, before = start, evaluator.student(start, at=0, splits=("test",))
        first = before
        round_results = []
        for r in range(1, cfg.rounds + 1):
            teachers = {t.name: _teacher(teacher_ctx, block, t, student, upstream, r) for t in cfg.teachers}
            tracker.set_tags(run_id, {f"stagewise.teacher.{n}" + (f".round{r}" if r > 1 else ""): str(p)
                                      for n, p in teachers.items()})  # which checkpoint taught each domain

            check_same_tokenizer(student, teachers)
            teacher_scores = evaluator.teachers(teachers, at=r)
            ckpt, round_run_id = _round(ctx, block, r, student, teachers, rows, run_id)
            after = evaluator.student(ckpt.path, at=r)
            recovered = _recovered(before, after, teacher_scores, cfg)
            tracker.log_metrics(run_id, [(r, 0, recovered)])
            log.info("distill: round %d: %s", r, ", ".join(f"{k.removeprefix('distill/')} {v:.2f}"
                                                          for k, v in sorted(recovered.items())) or "no teacher gain")
            round_results.append((ckpt, teacher_scores, recovered))
            student, before = ckpt.path, after
        ckpt, teacher_scores, recovered = round_results[-1]
        retention = evaluator.retention(start, ckpt.path, cfg.rounds)
        final = {**before, **teacher_scores, **recovered, **retention}
        summary = StageSummary(metric=TARGET, before=first.get(TARGET), after=before.get(TARGET),
                               higher_is_better=True, tokens=ckpt.tokens_seen, dev_metric=DEV_TARGET,
                               **gain_fields(evaluator.items.get(start, {}).get(TARGET),
                                             evaluator.items.get(ckpt.path, {}).get(TARGET), True))
        result = StageResult(stage=STAGE, parent=start, checkpoint=ckpt.path, run_id=run_id,
                             metrics={**final, **{f"base/{k}": v for k, v in first.items()}}, stage_dir=str(out_dir),
                             summary=summary)
        _report(tracker, run_id, round_run_id, first, before, teacher_scores)
        return finish(ctx, out_dir, result, final, at=(cfg.rounds, ckpt.tokens_seen))


def _fixed_teacher(t: TeacherSpec, upstream: Upstream, base_dir: str) -> str:
    """A checkpoint or stage teacher's directory (checked before any work)."""
    if t.stage is not None:
        result = upstream.of(t.stage)
        if result is None:
            raise BadInput(f"stages.distill.teachers[{t.name}].stage: stage {t.stage!r} did not run before distill "
                           "in this run (add it to --stages)")
        return result.checkpoint
    path = Path(t.checkpoint) if Path(t.checkpoint).is_absolute() else Path(base_dir) / t.checkpoint
    if not (path / "config.json").is_file():
        raise BadInput(f"stages.distill.teachers[{t.name}].checkpoint: {path} is not a checkpoint directory "
                       "(no config.json)")
    return str(path)


def _teacher(ctx: StageContext, block: DistillInputs, t: TeacherSpec, student: str, upstream: Upstream,
             round_: int) -> str:
    """The teacher's checkpoint for this round: trained here (a nested RL flow) when it has an `rl` block."""
    if t.rl is None:
        return _fixed_teacher(t, upstream, ctx.base_dir)
    name = f"{STAGE}-teacher-{t.name}" + (f"-round{round_}" if round_ > 1 else "")
    inputs = RLInputs(stage=teacher_rl_block(t, block.rl), model_from=student, world_entities=block.world_entities,
                      name=name, only_domains=t.domains, evaluate=False, reasoning_switch=block.reasoning_switch)
    return rl_flow.with_options(flow_run_name=name)(ctx, inputs, Upstream()).checkpoint


class _Evaluator:
    """Held-out pass@1 of the student and the teachers, and the eval suite's retention."""

    def __init__(self, ctx: StageContext, block: DistillInputs, rows: StageRows, run_id: str):
        self.ctx, self.block, self.rows, self.run_id = ctx, block, rows, run_id
        domains = {r.domain for r in rows.train}
        self.heldout = {split: round_robin([r for r in held if r.domain in domains], lambda r: r.domain,
                                           block.data.heldout_limit) for split, held in rows.split(ctx.seed).items()}
        self.tokenizer, self.wired = None, None
        self.memo = ScoreMemo(ctx.stages_root)  # the student is RL's start: its scores are read back
        self.items: dict[str, dict[str, dict[str, float]]] = {}
        """checkpoint -> metric -> each prompt's pass@1 (the closing table's interval)"""

    def wiring(self, checkpoint: str):
        """Prompts and verifiers, made once (every checkpoint here shares the student's tokenizer)."""
        if self.wired is None:
            self.tokenizer = install_chat_template(AutoTokenizer.from_pretrained(checkpoint))  # ours where none
            self.wired = RLWiring(self.tokenizer, self.rows.train + [r for held in self.heldout.values() for r in held],
                                  _accuracy_only(),
                                  self.block.stage.reasoning, self.block.reasoning_switch)
        return self.wired

    def _score(self, checkpoint: str, ids: list[str], prefix: str, at: int) -> dict[str, float]:
        if not ids:
            return {}
        cfg, wiring = self.block.stage, self.wiring(checkpoint)
        model = load_model(checkpoint, device=self.ctx.runtime.device)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        generator = HFGenerator(model, end_ids(self.tokenizer), pad, device=self.ctx.runtime.device)
        generator.sync_weights(model.state_dict())
        ro = cfg.rollout
        scored = value_of(heldout_eval_task(generator, wiring, ids, self.block.data.heldout_samples, ro.max_new_tokens,
                                            ro.temperature, self.ctx.seed, self.ctx.tracker, self.run_id, (at, 0),
                                            prefix=prefix, memo=self.memo, weights=checkpoint_hash(checkpoint)))
        self.items.setdefault(checkpoint, {}).update(scored.items)
        return scored.metrics

    def student(self, checkpoint: str, at: int, splits: tuple[str, ...] = ("dev", "test")) -> dict[str, float]:
        """The student on `splits`: distill/dev/student/... and distill/test/student/..."""
        out: dict[str, float] = {}
        for split, held in self.heldout.items():
            if split in splits:
                out |= self._score(checkpoint, [r.id for r in held], f"distill/{split}/student", at)
        return out

    def teachers(self, teachers: dict[str, str], at: int) -> dict[str, float]:
        """Each teacher on the test rows of its own domains (what the student's recovered share is read on)."""
        out: dict[str, float] = {}
        for t in self.block.stage.teachers:
            ids = [r.id for r in self.heldout["test"] if r.domain in t.domains]
            scores = self._score(teachers[t.name], ids, f"distill/teacher/{t.name}", at)
            out |= {f"distill/test/teacher/{k.split('/', 3)[3]}": v for k, v in scores.items()
                    if not k.endswith("/all")}
        if out:
            self.ctx.tracker.log_metrics(self.run_id, [(at, 0, out)])
        return out

    def retention(self, start: str, final: str, at: int) -> dict[str, float]:
        """The eval suite on the start and on the final student: per-score deltas and whether every
        drop stays within retention_margin (distill/retained)."""
        cfg = self.block.stage
        tasks = self.block.suites.get(cfg.eval_suite or "")
        if not tasks:
            return {}
        dev = str(self.ctx.runtime.device)
        score = lambda path, step, prefix: value_of(suite_task(  # noqa: E731
            CheckpointRef(path=path, step=step, tokens_seen=0), tasks, cfg.eval_limit, self.ctx.tracker, self.run_id,
            prefix=prefix, device=dev))
        base, last = score(start, 0, "distill/chat/start"), score(final, at, "distill/chat/final")
        final_of = lambda k: k.replace("/start/", "/final/")  # noqa: E731
        deltas = {f"distill/chat/{k.removeprefix('distill/chat/start/')}_delta": last[final_of(k)] - v
                  for k, v in base.items() if "stderr" not in k and final_of(k) in last}
        worst = min(deltas.values(), default=0.0)
        retained = float(worst >= -cfg.retention_margin)
        if not retained:
            run_logger().warning("distill: the %s suite dropped by %.3f (> retention_margin %.3f): %s", cfg.eval_suite,
                                 -worst, cfg.retention_margin, deltas)
        out = {**deltas, "distill/retained": retained, "distill/chat/worst_delta": worst}
        self.ctx.tracker.log_metrics(self.run_id, [(at, 0, out)])
        return out


def _accuracy_only():
    return RewardConfig(accuracy=1.0)


def _recovered(before: dict[str, float], after: dict[str, float], teachers: dict[str, float],
               cfg: DistillStage) -> dict[str, float]:
    """Per domain, the share of its teacher's test pass@1 gain over the round's start that the
    student kept: (student after - before) / (teacher - before); no value where the teacher gained nothing."""
    out = {}
    for domain in cfg.routes():
        key = f"distill/test/student/pass_at_1/{domain}"
        teacher = teachers.get(f"distill/test/teacher/pass_at_1/{domain}")
        if key in before and key in after and teacher is not None:
            out[f"distill/teacher_gain/{domain}"] = teacher - before[key]
            if teacher - before[key] > 0:
                out[f"distill/recovered/{domain}"] = (after[key] - before[key]) / (teacher - before[key])
    return out


def _round(ctx: StageContext, block: DistillInputs, r: int, student: str, teachers: dict[str, str], rows: StageRows,
           parent_run_id: str) -> tuple[CheckpointRef, str]:
    """One round: distil the teachers into the student; its own step and nested MLflow run (its id returned)."""
    cfg = block.stage
    name = f"{STAGE}/round-{r}"
    not_trained = {"vllm_url", "vllm_weight_sync", "rounds", "eval_suite", "eval_limit", "retention_margin", "data"}
    spec = {"stage": block_spec(cfg, not_trained), "data": block.data.model_dump(), "seed": ctx.seed,
            "version": DISTILL_VERSION} | switch_spec(block.reasoning_switch)
    out_dir = step_dir(ctx.stages_root, f"{STAGE}-round", spec,
                       [checkpoint_hash(student), *rows.hashes(),
                        *(f"{k}={checkpoint_hash(v)}" for k, v in sorted(teachers.items()))])
    round_ctx = ctx.model_copy(update={"parent_run_id": parent_run_id})
    with stage_run(round_ctx, name, {"stagewise.start_checkpoint": student}) as run_id:
        reused = reused_result(round_ctx, name, run_id, out_dir)
        if reused is not None:
            meta = read_meta(reused.checkpoint)
            return CheckpointRef(path=reused.checkpoint, step=meta.step, tokens_seen=meta.tokens_seen,
                                 sha256=meta.weight_sha256 or ""), run_id
        train = _round_on_nemo_rl if cfg.engine == "nemo_rl" else _train_round
        ckpt = train(round_ctx, block, student, teachers, rows, out_dir, run_id)
        result = StageResult(stage=f"{STAGE}-round-{r}", parent=student, checkpoint=ckpt.path, run_id=run_id,
                             stage_dir=str(out_dir))
        finish(round_ctx, out_dir, result, at=(ckpt.step, ckpt.tokens_seen))
        return ckpt, run_id


def _train_round(ctx: StageContext, block: DistillInputs, student: str, teachers: dict[str, str], rows: StageRows,
                 out_dir: Path, run_id: str) -> CheckpointRef:
    cfg, device = block.stage, ctx.runtime.device
    refuse_backend(cfg, str(device), "stages.distill")
    tokenizer = install_chat_template(AutoTokenizer.from_pretrained(student))  # ours only where it carries none
    wiring = RLWiring(tokenizer, rows.train, _accuracy_only(), cfg.reasoning, block.reasoning_switch)
    routes = _routes(cfg, rows)
    policy = load_model(student, device=device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    urls = {t.name: t.url for t in cfg.teachers}
    router = TeacherRouter({name: make_teacher(cfg.teacher_backend, name, path=path, url=urls[name], device=str(device))
                            for name, path in teachers.items()}, routes, cfg.default_teacher)
    generator = None
    try:
        generator = stage_generator(cfg, policy, end_ids(tokenizer), pad_id, device, student, out_dir,
                                    ctx.runtime.precision_for(cfg.precision))
        by_domain, ratios = _prompts(cfg, rows)
        sampler = CurriculumSampler(by_domain, ratios, cfg.prompts_per_step, cfg.steps, None, ctx.seed)
        batches = DistillBatches(policy, generator, wiring.prompts, sampler, router.score, cfg.rollout, ctx.seed,
                                 pad_id, discount=cfg.discount, score=wiring.score)
        train_cfg = cfg.steps_train_config(wiring.prompts, ctx.runtime)
        trainer = make_trainer(policy, train_cfg, batches, GRPOObjective(cfg.loss), out_dir=out_dir, stage=STAGE,
                               tokenizer_dir=student, recipe_hash=ctx.recipe_hash,
                               log=rl_metric_log(ctx.tracker, run_id, prefix=STAGE), device=device, parent=student)
        resume = resume_point(out_dir, ctx.resume)
        return value_of(rl_train_task(trainer, batches, resume.path if resume else None, ctx.tracker, run_id))
    finally:
        router.close()
        getattr(generator, "close", lambda: None)()  # a rollout worker or the stage's vLLM server stops too


def _routes(cfg: DistillStage, rows: StageRows) -> dict[str, str]:
    """domain -> teacher name; BadInput when a domain of the prompts has no teacher and no default."""
    routes = cfg.routes()
    unrouted = sorted({r.domain for r in rows.train} - set(routes))
    if unrouted and cfg.default_teacher is None:
        raise BadInput(f"stages.distill.teachers: no teacher covers domain(s) {', '.join(unrouted)} "
                       "(list them under a teacher's domains or set default_teacher)")
    return routes


def _prompts(cfg: DistillStage, rows: StageRows) -> tuple[dict[str, list[tuple[str, float]]], dict[str, float]]:
    """What the sampler draws a round's prompts from (every prompt at pass rate 0.5: no curriculum)
    and the domains' shares."""
    by_domain: dict[str, list[tuple[str, float]]] = {}
    for r in rows.train:
        by_domain.setdefault(r.domain, []).append((r.id, 0.5))
    return by_domain, cfg.domains or {d: 1.0 for d in sorted(by_domain)}


def _refuse_on_nemo_rl(cfg: DistillStage, rows: StageRows, wiring) -> None:
    """What NeMo RL's MOPD cannot express given the rows (their verifiers' agents, the longest prompt)."""
    refuse_unsupported("stages.distill", unsupported_distill(
        cfg, environments=gym_environments(rows.train), gym_agents=cfg.nemo_gym.agents if cfg.nemo_gym else None,
        max_prompt_tokens=max(len(wiring.prompts[r.id].ids) for r in rows.train)))


def _round_on_nemo_rl(ctx: StageContext, block: DistillInputs, student: str, teachers: dict[str, str],
                      rows: StageRows, out_dir: Path, run_id: str) -> CheckpointRef:
    """One round on NeMo RL's MOPD (engines/nemo_rl/stage.py): the prompts in our sampler's order,
    the round's teachers by their HF directories, one driver launch, NeMo RL's converter, the
    export adopted as the round's checkpoint."""
    cfg = block.stage
    _routes(cfg, rows)
    wiring = RLWiring(load_chat_tokenizer(student), rows.train, _accuracy_only(), cfg.reasoning,
                      block.reasoning_switch)
    by_domain, ratios = _prompts(cfg, rows)
    plan = distill_plan(cfg, student=student, teachers=teachers, rows={r.id: r.row for r in rows.train},
                        agents=row_agents(rows.train, cfg.nemo_gym), by_domain=by_domain, ratios=ratios,
                        max_prompt_tokens=max(len(p.ids) for p in wiring.prompts.values()), out_dir=out_dir,
                        seed=ctx.seed, mlflow=mlflow_target(ctx.tracker, run_id, STAGE))
    return run_engine(ctx, STAGE, cfg.engine, cfg.launch, run_id, out_dir, plan, parent=student,
                      tokenizer_dir=student)


def _report(tracker, run_id: str, round_run_id: str, before: dict[str, float], after: dict[str, float],
            teachers: dict[str, float]) -> None:
    """Student before/after and each teacher, per domain (JSON + PNGs), and the last round's reverse KL."""
    if not before:
        return

    table = {k: {"start": before[k], "distilled": after.get(k),
                 "teacher": teachers.get(k.replace("/student/", "/teacher/"))} for k in before}
    tracker.log_json(run_id, table, "reports/distill_before_after.json")
    tracker.log_figure(run_id, before_after_plot(before, after, "Distillation: held-out pass@1 and greedy accuracy"),
                       "reports/distill_before_after.png")
    pass_at_1 = "distill/test/student/pass_at_1/"
    per_domain = lambda m, prefix: {k.removeprefix(prefix): v for k, v in m.items()  # noqa: E731
                                    if k.startswith(prefix) and not k.endswith("/all")}
    kl = {d: [(s, v) for s, _, v in points] for d, points in
          ((n.removeprefix("distill/reverse_kl/"), p) for n, p in tracker.metric_histories(
              round_run_id, [f"distill/reverse_kl/{d}" for d in per_domain(before, pass_at_1)]).items())}
    tracker.log_figure(run_id, distill_plot(kl, per_domain(before, pass_at_1), per_domain(after, pass_at_1),
                                            per_domain(teachers, "distill/test/teacher/pass_at_1/")),
                       "reports/distill.png")


def _reads(block: DistillInputs) -> tuple[str, ...]:
    """The earlier stages distillation reads: a student named by stage, and every stage teacher."""
    return tuple(n for n in (block.stage.student, *(t.stage for t in block.stage.teachers)) if n)


STAGE_ENTRY = Stage(name=STAGE, flow=distill_flow, select=select, start="handed_on", reads=_reads,
                    signals=(Signal("reverse KL to the teachers per round", ("distill/reverse_kl",), nested=True),))
