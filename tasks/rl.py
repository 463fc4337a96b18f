"""Prefect tasks of the RL stage (the rows' wiring and scoring are eval/rl_wiring.py and eval/rl_scoring.py).

    rl_world_task          the demo world's RL rows, once per (settings, seed)
    profile_task           pass rate of every training prompt under the starting policy (k samples),
                           written once into the stage directory (a resume reads it back)
    heldout_eval_task      pass@1 (mean verifier result over samples at the rollout temperature) and
                           greedy accuracy per domain, logged under rl/<split>/ (eval/splits.py), memoised
    rl_train_task          the engine's Trainer with GRPOObjective over RolloutBatches

Metric names: flows/rl.py `rl_metric_log` renames RL's own objective values (clip and masked-IS
fractions, KL, entropy, the ratio) from the trainer's `train/<name>` to `rl/<name>`.
"""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task

from stagewise.data.atomic import building
from stagewise.data.content_hash import step_hash
from stagewise.data.world.rl_prompts import generate_rl_world
from stagewise.eval.intervals import Scored
from stagewise.eval.plots import pass_rate_histogram
from stagewise.eval.rl_scoring import HELDOUT_KIND, ITEMS, heldout_scores, heldout_spec
from stagewise.eval.rl_wiring import RL_DATA_VERSION, RLWiring
from stagewise.eval.score_memo import ScoreMemo
from stagewise.model.checkpoint import read_meta
from stagewise.model.rl_batches import pass_rates
from stagewise.refs import CheckpointRef
from stagewise.store.policy import once, retrying, run_logger
from stagewise.store.steps import cached
from stagewise.store.tracking import Tracker

# --------------------------------------------------------------------------- the demo world

@task(**retrying("rl-world"))
def rl_world_task(world, entities: int, seed: int, workdir: str) -> str:
    """Write the demo world's RL rows once per (settings, seed); returns the directory."""
    key = step_hash("rl_world", {"world": world, "entities": entities, "seed": seed, "version": RL_DATA_VERSION})
    out = Path(workdir) / "rl_world" / key
    if (out / "rl_eval.jsonl").is_file():
        return cached(str(out), key, f"RL world: reused {out}")
    with building(out) as tmp:
        generate_rl_world(tmp, seed, world.per_domain, world.eval_fraction, entities, world.max_digits,
                          tuple(world.format_kinds) if world.format_kinds else None)
    run_logger().info("RL world written to %s", out)
    return str(out)


# --------------------------------------------------------------------------- tasks

@task(**once("rl-profile"))
def profile_task(out_dir: str, generator, wiring: RLWiring, ids: list[str], samples: int, max_new_tokens: int,
                 temperature: float, seed: int, tracker: Tracker, run_id: str) -> dict[str, float]:
    """Pass rate of every training prompt under the starting policy, stored in `<out_dir>/profile.json`.

    The file is written before training starts, so a resumed run reads the very profile the
    interrupted one trained with (its curriculum depends on it)."""
    path = Path(out_dir) / "profile.json"
    if path.is_file():
        rates = json.loads(path.read_text())["pass_rates"]
    else:
        results = pass_rates(generator, [wiring.prompts[i] for i in ids], wiring.score, samples, max_new_tokens,
                             temperature, seed)
        rates = {i: sum(v) / len(v) for i, v in results.items()}
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"samples": samples, "pass_rates": rates}))
        tmp.replace(path)
    _log_profile(rates, wiring, samples, tracker, run_id)
    return rates


def _log_profile(rates: dict[str, float], wiring: RLWiring, samples: int, tracker: Tracker, run_id: str) -> None:
    per: dict[str, list[float]] = {}
    for pid, rate in rates.items():
        per.setdefault(wiring.prompts[pid].domain, []).append(rate)
    tracker.log_json(run_id, {"samples": samples, "pass_rates": rates}, "rl/profile.json")
    tracker.log_figure(run_id, pass_rate_histogram(per, samples), "rl/profile_pass_rates.png")


@task(**once("rl-heldout"))
def heldout_eval_task(generator, wiring: RLWiring, ids: list[str], samples: int, max_new_tokens: int,
                      temperature: float, seed: int, tracker: Tracker, run_id: str, at: tuple[int, int],
                      prefix: str = "rl/test", memo: ScoreMemo | None = None, weights: str = "") -> Scored:
    """pass@1 and greedy accuracy per domain on the held-out prompts, logged as `<prefix>/pass_at_1/<domain>`
    and `<prefix>/greedy/<domain>` at `at` = (step, tokens), with each prompt's pass@1 (the items of
    `<prefix>/pass_at_1/all`, an artifact `heldout/<prefix>/items_<step>.json`); read from `memo` when
    the weights the generator holds (`weights`, their sha256) were scored this way before."""
    def score() -> dict:
        return heldout_scores(generator, wiring, ids, samples, max_new_tokens, temperature, seed)

    if memo is None:
        scores = score()
    else:
        spec = heldout_spec(weights, generator, wiring, ids, [samples, max_new_tokens, temperature, seed])
        scores, remembered = memo.get(HELDOUT_KIND, spec, score)
        if remembered is not None:
            run_logger().info("%s: held-out scores of these weights read from %s (scored before)", prefix, remembered)
    metrics = {f"{prefix}/{kind}/{d}": v for kind, per in scores.items() if kind != ITEMS for d, v in per.items()}
    items = {f"{prefix}/{kind}/all": per for kind, per in scores.get(ITEMS, {}).items()}
    tracker.log_metrics(run_id, [(at[0], at[1], metrics)])
    if items:
        tracker.log_json(run_id, items, f"heldout/{prefix}/items_{at[0]:08d}.json")
    return Scored(metrics, items)


@task(**once("rl-train"))
def rl_train_task(trainer, batches, resume_from: str | None, tracker: Tracker, run_id: str) -> CheckpointRef:
    """Train GRPO steps until the stage's budget (from `resume_from` when given); save; return the checkpoint."""
    logger = run_logger()
    with trainer:
        try:
            if resume_from:
                trainer.resume(Path(resume_from))
                logger.info("rl: resuming at step %d from %s", trainer.step, resume_from)
            result = trainer.fit()
        finally:
            batches.close()
    meta = read_meta(result.checkpoint)
    return CheckpointRef(path=str(result.checkpoint), step=result.step, tokens_seen=result.tokens_seen,
                         sha256=meta.weight_sha256 or "")
