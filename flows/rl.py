"""The RL stage as a Prefect flow: GRPO on verifiable rewards, from the checkpoint SFT handed on.

    rl_flow
      ├─ rl-world              the demo world's task rows (NeMo Gym-compatible JSONL), once per seed
      ├─ rl-profile            k samples per training prompt with the starting policy: pass rates,
      │                        the difficulty filter (k/k dropped), a histogram in MLflow
      ├─ rl-heldout (before)   pass@1 and greedy accuracy per domain on held-out rows
      ├─ rl-train              GRPO steps (model/trainer.py + model/rl_batches.py + objectives/grpo.py):
      │                        Gaussian curriculum, dynamic sampling, masked IS, one-step off-policy
      └─ rl-heldout (after)    the same evaluation on the trained weights

MLflow: one run `rl` with per-step `rl/reward/<component>`, `rl/train_accuracy/<domain>`,
`rl/kept_groups`, `rl/response_length`, `rl/is_masked_fraction`, `rl/logprob_mismatch` (mean |Δ log p|
sampler vs trainer: what masked IS is for), `rl/clip_fraction`, `rl/kl`,
`rl/entropy`, `rl/rollout_tokens_per_s`, `train/tokens_per_s`; the filter's counts
(`rl/filter/...`); held-out `rl/<split>/pass_at_1/<domain>` and `rl/<split>/greedy/<domain>` at
step 0 and at the end, per split of the held-out rows (eval/splits.py): `rl/dev/...` (what tuning and
ablations compare) and `rl/test/...` (what the closing table reports, read by nothing else); the
profile (JSON + PNG). The stage is a content-addressed step over its
block, the seed, the rows and the start checkpoint: an unchanged recipe reuses it. The final
checkpoint is registered with the alias `rl`.

pass@1 is the mean verifier result of one sampled response at the rollout temperature,
estimated from `heldout_samples` responses per prompt (each prompt weighs the same); greedy is
the single temperature-0 answer, as SFT's held-out exact match reads it.

With `engine: nemo_rl` the world, the profile, the filter and both evaluations are the same;
rl-train is NeMo RL's GRPO driver on the kept prompts in our sampler's order, then NeMo RL's
converter, the export adopted as the stage's checkpoint (engines/nemo_rl/stage.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import flow
from pydantic import BaseModel
from transformers import AutoTokenizer

from stagewise.data.chat import install_chat_template
from stagewise.data.config import WORLD_FACTS
from stagewise.data.digest import rows_digest
from stagewise.data.errors import BadInput
from stagewise.data.reasoning_switch import SwitchSetting, switch_spec
from stagewise.data.rl_curriculum import difficulty_filter
from stagewise.data.rl_rows import prompt_key
from stagewise.data.rl_sampler import CurriculumSampler
from stagewise.data.sources import resolve_path
from stagewise.engines.launch.stage import run_engine
from stagewise.engines.nemo_rl.stage import gym_environments, mlflow_target, refuse_unsupported, rl_plan, row_agents
from stagewise.engines.nemo_rl.translate import unsupported
from stagewise.eval.heldout import end_ids, round_robin
from stagewise.eval.intervals import Scored, gain_fields
from stagewise.eval.plots import before_after_plot, rl_training_plot
from stagewise.eval.rl_wiring import RLWiring, load_rows
from stagewise.eval.score_memo import ScoreMemo
from stagewise.eval.splits import split_rows
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
from stagewise.model.checkpoint import load_weights_into
from stagewise.model.objectives.grpo import GRPOObjective, token_logprobs
from stagewise.model.rl_batches import RolloutBatches, pass_rates, seed_for
from stagewise.model.rollout import make_generator
from stagewise.model.train_spec import make_trainer
from stagewise.model.vllm_server import VLLMServer, vllm_python
from stagewise.recipe import Recipe
from stagewise.recipe.blocks.on_policy import block_spec
from stagewise.recipe.blocks.rl import RLStage
from stagewise.refs import CheckpointRef, StageResult, StageSummary
from stagewise.store.policy import run_logger
from stagewise.store.steps import step_dir, value_of
from stagewise.store.tracking import Tracker
from stagewise.tasks.rl import heldout_eval_task, profile_task, rl_train_task, rl_world_task

STAGE = "rl"
TARGET = "rl/test/pass_at_1/all"
DEV_TARGET = "rl/dev/pass_at_1/all"


class RLInputs(BaseModel):
    """What RL reads from the recipe: its block, where to start without an upstream stage, and
    the pretraining world's entity count (for the demo world's fact rows)."""

    stage: RLStage
    model_from: str | None = None
    world_entities: int = WORLD_FACTS
    name: str = STAGE
    """The stage's name (MLflow run, step directory, checkpoint alias): another name when the RL
    machinery trains a distillation teacher (flows/distill.py)."""
    only_domains: list[str] | None = None
    """Train on the rows of these domains only (a per-domain teacher); None: every source's rows."""
    evaluate: bool = True
    """Score held-out pass@1 before and after (a distillation teacher skips it: the distillation
    stage scores every teacher next to the student on the same rows)."""
    reasoning_switch: SwitchSetting = "auto"
    """The recipe's tokenizer.reasoning_switch: how the prompts say `stages.rl.reasoning` to the model."""


def select(recipe: Recipe) -> RLInputs | None:
    if recipe.stages.rl is None:
        return None
    world = recipe.data.world
    return RLInputs(stage=recipe.stages.rl, model_from=recipe.model.from_,
                    world_entities=world.facts if world else WORLD_FACTS,
                    reasoning_switch=recipe.tokenizer.reasoning_switch)


RL_VERSION = 2
"""Bump when what a completion is scored on changes (decoding, verifiers): finished RL steps then retrain."""


def rl_spec(block: RLInputs, seed: int) -> dict:
    """What determines the stage's outcome besides its inputs' hashes (rows, start checkpoint)."""
    # where a vLLM server listens says nothing about the weights: not hashed
    spec = {"stage": block_spec(block.stage, {"vllm_url", "vllm_weight_sync"}), "seed": seed, "version": RL_VERSION}
    ro = block.stage.rollout
    if block.stage.engine == "torch" and not ro.off_policy and ro.minibatches > 1:
        # a synchronous split batch's later parts train against the trainer's π_old (model/rl_batches.py),
        # no longer the sampler's log-probs: such steps finished before that retrain
        spec["old_logprobs"] = "trainer"
    if block.only_domains is not None:
        spec["only_domains"] = sorted(block.only_domains)
    if not block.evaluate:
        spec["evaluate"] = False
    return spec | switch_spec(block.reasoning_switch)


@flow(name="rl")
def rl_flow(ctx: StageContext, block: RLInputs, upstream: Upstream | None = None) -> StageResult:
    """GRPO from the checkpoint the previous stage handed on (else `model.from`), per `stages.rl`."""
    log = run_logger()
    cfg = block.stage
    start_from = start_checkpoint(upstream or Upstream(), block.model_from)
    name = block.name
    with stage_run(ctx, name, {"stagewise.start_checkpoint": start_from}) as run_id:
        rows = stage_rows(ctx, cfg.data, block.world_entities, block.only_domains, name)
        train_rows, heldout_rows = rows.train, rows.split(ctx.seed)
        inputs = [checkpoint_hash(start_from), *rows.hashes()]
        out_dir = step_dir(ctx.stages_root, name, rl_spec(block, ctx.seed), inputs)
        reused = reused_result(ctx, name, run_id, out_dir)
        if reused is not None:
            return reused
        return _train(ctx, block, start_from, train_rows, heldout_rows, out_dir, run_id, log)


@dataclass(frozen=True)
class StageRows:
    """The task rows a stage reads (RL, or distillation's prompts), and their files."""

    train: list
    heldout: list
    paths: list[Path]
    heldout_path: Path | None

    def hashes(self) -> list[str]:
        """The rows' content as step inputs (a file's bytes; a directory's row files, data/digest.py)."""
        return [*(rows_digest(p) for p in self.paths), rows_digest(self.heldout_path) if self.heldout_path else "-"]

    def split(self, seed: int) -> dict[str, list]:
        """The held-out rows by split, {"dev": [...], "test": [...]} (eval/splits.py: by prompt hash)."""
        return split_rows(self.heldout, lambda task: prompt_key(task.row), seed)


def stage_rows(ctx: StageContext, data, world_entities: int, only_domains: list[str] | None, name: str) -> StageRows:
    """Training and held-out rows of an RLData block (the demo world written first when asked),
    training rows narrowed to `only_domains` when given."""
    world_dir = None
    if data.world is not None:
        world_dir = value_of(rl_world_task(data.world, data.world.entities or world_entities, ctx.seed, ctx.workdir))
    paths = [resolve_path(s.path, ctx.base_dir, world_dir) for s in data.sources]
    train = [r for s, p in zip(data.sources, paths)
             for r in load_rows(p, s.name, s.domain, s.environment, s.on_bad_line)
             if only_domains is None or r.domain in only_domains]
    if not train:
        raise BadInput(f"{name}: no training rows in domain(s) {', '.join(only_domains or [])}")
    heldout = data.heldout or ("@world/rl_eval.jsonl" if world_dir else None)
    heldout_path = resolve_path(heldout, ctx.base_dir, world_dir) if heldout else None
    heldout_rows = load_rows(heldout_path, "heldout", None, None) if heldout_path else []
    return StageRows(train, heldout_rows, paths, heldout_path)


def _train(ctx: StageContext, block: RLInputs, start_from: str, train_rows, heldout_rows: dict[str, list],
           out_dir: Path, run_id: str, log) -> StageResult:
    cfg, device = block.stage, ctx.runtime.device
    refuse_backend(cfg, str(device), "stages.rl")
    tokenizer = install_chat_template(AutoTokenizer.from_pretrained(start_from))  # ours only where it carries none
    trained = {r.domain for r in train_rows}  # held-out rows of the domains this stage trains
    untrained = sorted({str(r.domain) for rows in heldout_rows.values() for r in rows if r.domain not in trained})
    if untrained and block.evaluate:
        log.warning("rl: held-out rows of domain(s) %s are not scored: this stage trains %s (a row's domain is its "
                    "\"domain\" field)", ", ".join(untrained), ", ".join(sorted(map(str, trained))))
    heldout_rows = {split: round_robin([r for r in rows if r.domain in trained and block.evaluate],
                                       lambda r: r.domain, cfg.data.heldout_limit) for split, rows in heldout_rows.items()}
    wiring = RLWiring(tokenizer, train_rows + [r for rows in heldout_rows.values() for r in rows], cfg.rewards,
                      cfg.reasoning, block.reasoning_switch)
    if cfg.engine == "nemo_rl":  # what only the rows tell, before anything trains: verifiers, longest prompt

        refuse_unsupported("stages.rl", unsupported(cfg, environments=gym_environments(train_rows),
                                                    gym_agents=cfg.nemo_gym.agents if cfg.nemo_gym else None,
                                                    max_prompt_tokens=_longest_prompt(wiring, train_rows)))
    policy = load_model(start_from, device=device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    generator = stage_generator(cfg, policy, end_ids(tokenizer), pad_id, device, start_from, out_dir,
                                ctx.runtime.precision_for(cfg.precision))
    try:
        return _with_generator(ctx, block, start_from, train_rows, wiring, heldout_rows, policy, generator, pad_id,
                               out_dir, run_id, log)
    finally:
        getattr(generator, "close", lambda: None)()  # a rollout worker process stops with the stage


def _with_generator(ctx: StageContext, block: RLInputs, start_from: str, train_rows, wiring, heldout_rows, policy,
                    generator, pad_id: int, out_dir: Path, run_id: str, log) -> StageResult:
    cfg, tracker = block.stage, ctx.tracker
    ro = cfg.rollout

    # the difficulty profile and filter
    train_ids = [r.id for r in train_rows]
    if cfg.filter is not None:
        rates = value_of(profile_task(str(out_dir), generator, wiring, train_ids, cfg.filter.samples,
                                      ro.max_new_tokens, ro.temperature, ctx.seed, tracker, run_id))
        kept, counts = difficulty_filter(rates, cfg.filter.drop_solved, cfg.filter.drop_unsolved)
    else:
        rates = {i: 0.5 for i in train_ids}
        kept, counts = train_ids, {"kept": len(train_ids)}
    tracker.log_metrics(run_id, [(0, 0, {f"rl/filter/{k}": float(v) for k, v in counts.items()})])
    log.info("%s: %d of %d training prompts kept by the difficulty filter (%s)", block.name, len(kept), len(train_ids),
             ", ".join(f"{k} {v}" for k, v in counts.items()))

    memo = ScoreMemo(ctx.stages_root)  # RL's start is distillation's student: scored once, read back there

    def evaluate(at: tuple[int, int], weights: str, splits: tuple[str, ...] = ("dev", "test")) -> Scored:
        """pass@1 and greedy accuracy on the held-out rows of `splits`: rl/dev/..., rl/test/... (and
        each prompt's pass@1, the items of the closing table's interval)"""
        out = Scored({})
        for split, rows in heldout_rows.items():
            if rows and split in splits:
                out |= value_of(heldout_eval_task(
                    generator, wiring, [r.id for r in rows], cfg.data.heldout_samples, ro.max_new_tokens,
                    ro.temperature, ctx.seed, tracker, run_id, at, prefix=f"rl/{split}", memo=memo, weights=weights))
        return out
    generator.sync_weights(policy.state_dict())
    # the start on test (the closing table's "before"); dev where it is read, at the end (ablations)
    scored_before = evaluate((0, 0), checkpoint_hash(start_from), splits=("test",))
    before = scored_before.metrics
    _say_heldout(log, block.name, "before", before)

    by_domain: dict[str, list[tuple[str, float]]] = {}
    for i in kept:
        by_domain.setdefault(wiring.prompts[i].domain, []).append((i, rates[i]))
    ratios = cfg.domains or {d: 1.0 for d in sorted(by_domain)}
    if block.only_domains is not None:  # a teacher trained on some domains keeps their shares only
        ratios = {d: w for d, w in ratios.items() if d in block.only_domains} or {d: 1.0 for d in sorted(by_domain)}
    if cfg.engine == "nemo_rl":
        ckpt = _on_nemo_rl(ctx, block, start_from, train_rows, wiring, by_domain, ratios, out_dir, run_id)

        load_weights_into(policy, ckpt.path)  # the adopted export, into the policy the evaluation samples with
        trained_tokens = ckpt.tokens_seen
    else:
        ckpt, trained_tokens = _on_torch(ctx, block, start_from, wiring, policy, generator, pad_id, by_domain, ratios,
                                         out_dir, run_id, log)
    generator.sync_weights(policy.state_dict())
    scored_after = evaluate((ckpt.step, ckpt.tokens_seen), ckpt.sha256 or checkpoint_hash(ckpt.path))
    after = scored_after.metrics
    _say_heldout(log, block.name, "after", after)
    deltas = {f"{k}_delta": after[k] - before[k] for k in before if k in after}
    tracker.log_metrics(run_id, [(ckpt.step, ckpt.tokens_seen, deltas)])
    _report(tracker, run_id, before, after)
    summary = StageSummary(metric=TARGET, before=before.get(TARGET), after=after.get(TARGET), higher_is_better=True,
                           tokens=trained_tokens, dev_metric=DEV_TARGET,
                           **gain_fields(scored_before.items.get(TARGET), scored_after.items.get(TARGET), True))
    result = StageResult(stage=block.name, parent=start_from, checkpoint=ckpt.path, run_id=run_id,
                         metrics={**after, **{f"base/{k}": v for k, v in before.items()}, **deltas},
                         stage_dir=str(out_dir), summary=summary)
    return finish(ctx, out_dir, result, {**after, **deltas}, at=(ckpt.step, ckpt.tokens_seen))


def _on_torch(ctx: StageContext, block: RLInputs, start_from: str, wiring, policy, generator, pad_id: int,
              by_domain: dict[str, list[tuple[str, float]]], ratios: dict[str, float], out_dir: Path, run_id: str,
              log) -> tuple[CheckpointRef, int]:
    """GRPO on our engine (model/trainer.py + model/rl_batches.py): the checkpoint and the rollout tokens trained."""
    cfg, tracker, device = block.stage, ctx.tracker, ctx.runtime.device
    ro = cfg.rollout
    sampler = CurriculumSampler(by_domain, ratios, cfg.prompts_per_step, cfg.steps // ro.minibatches, cfg.curriculum,
                                ctx.seed)  # the curriculum moves per rollout batch

    def reprofile(step: int) -> None:
        generator.sync_weights(policy.state_dict())
        ids = [i for rows in sampler.prompts.values() for i, _ in rows]
        results = pass_rates(generator, [wiring.prompts[i] for i in ids], wiring.score,
                             cfg.filter.samples if cfg.filter else 8, ro.max_new_tokens, ro.temperature,
                             seed_for(ctx.seed, "reprofile", step))
        fresh = {i: sum(v) / len(v) for i, v in results.items()}
        sampler.update(fresh)
        log.info("%s: step %d: the training reward stalled; re-profiled %d prompts (mean pass rate %.3f)", block.name,
                 step, len(fresh), sum(fresh.values()) / max(len(fresh), 1))

    reference = None
    if cfg.loss.kl_coeff > 0:  # the KL anchor: the stage's starting weights, frozen

        anchor = load_model(start_from, device=device).eval().requires_grad_(False)
        reference = lambda ids: token_logprobs(anchor, ids.to(device), ro.temperature)[0].cpu()  # noqa: E731
    batches = RolloutBatches(policy, generator, wiring.prompts, sampler, wiring.score, ro, ctx.seed, pad_id,
                             reprofile=reprofile if cfg.reprofile else None, plateau=cfg.reprofile,
                             reference=reference)
    train_cfg = cfg.steps_train_config(wiring.prompts, ctx.runtime)
    trainer = make_trainer(policy, train_cfg, batches, GRPOObjective(cfg.loss), out_dir=out_dir, stage=block.name,
                           tokenizer_dir=start_from, recipe_hash=ctx.recipe_hash, log=rl_metric_log(tracker, run_id),
                           device=device, parent=start_from)
    resume = resume_point(out_dir, ctx.resume)
    ckpt = value_of(rl_train_task(trainer, batches, resume.path if resume else None, tracker, run_id))
    return ckpt, batches.trained_tokens


def _on_nemo_rl(ctx: StageContext, block: RLInputs, start_from: str, train_rows, wiring,
                by_domain: dict[str, list[tuple[str, float]]], ratios: dict[str, float], out_dir: Path,
                run_id: str) -> CheckpointRef:
    """GRPO on NeMo RL (engines/nemo_rl/stage.py): the kept prompts in our sampler's order, one
    driver launch, NeMo RL's converter, the export adopted as `step-<steps>`."""
    cfg = block.stage
    kept = {i for ids in by_domain.values() for i, _ in ids}
    rows = [r for r in train_rows if r.id in kept]
    plan = rl_plan(cfg, start=start_from, rows={r.id: r.row for r in rows}, agents=row_agents(rows, cfg.nemo_gym),
                   by_domain=by_domain, ratios=ratios, max_prompt_tokens=_longest_prompt(wiring, rows),
                   out_dir=out_dir, seed=ctx.seed, mlflow=mlflow_target(ctx.tracker, run_id, block.name))
    return run_engine(ctx, block.name, cfg.engine, cfg.launch, run_id, out_dir, plan, parent=start_from,
                      tokenizer_dir=start_from)


def _longest_prompt(wiring, rows) -> int:
    """The longest rendered prompt of `rows` in tokens (what sizes NeMo RL's sequence, as ours)."""
    return max(len(wiring.prompts[r.id].ids) for r in rows)


def refuse_backend(cfg, device: str, at: str) -> None:
    """BadInput naming the key when the rollout backend cannot run here: NCCL weight sync off a CUDA
    device, or a stage-started vLLM server with no vLLM to start (model/vllm_server.py says how to get one)."""
    if cfg.backend != "vllm":
        return
    if cfg.vllm_weight_sync == "nccl" and not device.startswith("cuda"):
        raise BadInput(f"{at}.vllm_weight_sync: nccl broadcasts weights from a CUDA device; the runtime is {device} "
                       "(use vllm_weight_sync: files, or backend: hf / hf-process on a CPU)")
    if cfg.vllm_url is None:
        try:
            vllm_python()
        except RuntimeError as err:
            raise BadInput(f"{at}.backend: vllm with no vllm_url starts a vLLM server for the stage, and {err}") from None


def stage_generator(cfg, policy, end: list[int], pad_id: int, device, start_from: str, out_dir: Path, precision: str):
    """The sampler an on-policy stage (RL, distillation) asks for: its `backend` with that backend's options
    (the hf backends sample with `rollout.sampler_precision`'s copy; on_policy.py refuses bf16 on vllm).
    backend vllm without a `vllm_url`: a server of the stage's own on `start_from`, in the trainer's
    `precision`, its log `vllm.log` in `out_dir`, its weights reloaded from `out_dir`/vllm-weights, stopped
    by the generator's close()."""
    if cfg.backend == "vllm":
        server = None
        if cfg.vllm_url is None:
            server = VLLMServer(start_from, dtype="bfloat16" if precision == "bf16" else "float32",
                                log_path=out_dir / "vllm.log").start()
        return make_generator("vllm", policy, end, pad_id, url=server.url if server else cfg.vllm_url,
                              weight_sync=cfg.vllm_weight_sync, server=server,
                              weights_dir=out_dir / "vllm-weights" if cfg.vllm_weight_sync == "files" else None)
    sampler_precision = cfg.rollout.sampler_precision
    options = {"hf": {"device": device, "precision": sampler_precision},
               "hf-process": {"threads": cfg.worker_threads, "precision": sampler_precision}}[cfg.backend]
    return make_generator(cfg.backend, policy, end, pad_id, **options)


def _say_heldout(log, name: str, when: str, metrics: dict[str, float]) -> None:
    if metrics:
        log.info("%s: held-out %s: %s", name, when, ", ".join(f"{k.removeprefix('rl/')} {v:.3f}"
                                                        for k, v in sorted(metrics.items())))


def _report(tracker, run_id: str, before: dict[str, float], after: dict[str, float]) -> None:
    """The before/after table (JSON) and picture (PNG) of the held-out evaluation."""
    if not before:
        return

    table = {k: {"sft": before[k], "rl": after.get(k)} for k in before}
    tracker.log_json(run_id, table, "reports/rl_before_after.json")

    names = ["rl/groups", "rl/kept_groups", "rl/is_masked_fraction", "rl/clip_fraction",
             *(f"rl/reward/{c}" for c in ("accuracy", "format", "length", "total"))]
    tracker.log_figure(run_id, rl_training_plot(tracker.metric_histories(run_id, names), before, after),
                       "reports/rl_training.png")
    tracker.log_figure(run_id, before_after_plot(before, after, "RL: held-out pass@1 and greedy accuracy"),
                       "reports/rl_before_after.png")


STAGE_ENTRY = Stage(name=STAGE, flow=rl_flow, select=select, start="handed_on",
                    signals=(Signal("reward (mean over rollouts)", ("rl/reward/total", "rl/reward/accuracy")),
                             Signal("tokens masked by importance sampling", ("rl/is_masked_fraction",),
                                    when_flat="no token's trainer/sampler ratio left the mask's bounds "
                                              "(a synchronous sampler at the trainer's precision): nothing to mask")))


RL_OBJECTIVE_METRICS = ("pg_loss", "clip_fraction", "is_masked_fraction", "logprob_mismatch", "kl", "entropy",
                        "ratio_mean")
"""The objective's values that are RL's own: logged as `rl/<name>`, next to what the batch source measured
(`rl/reward/<component>`, kept groups, response length, rollout tokens/s)."""


def rl_metric_log(tracker: Tracker, run_id: str, prefix: str = "rl"):
    """The engine's log callback: RL's own objective values renamed from train/<x> to <prefix>/<x>."""
    def log(records: list[tuple[int, int, dict[str, float]]]) -> None:
        renamed = []
        for step, tokens, metrics in records:
            renamed.append((step, tokens, {(f"{prefix}/{k[6:]}" if k.startswith("train/") and k[6:] in RL_OBJECTIVE_METRICS
                                            else k): v for k, v in metrics.items()}))
        tracker.log_metrics(run_id, renamed)
    return log
