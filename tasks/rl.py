"""Prefect tasks of the RL stage, and the wiring between rows, verifiers, rollouts and the engine.

    rl_world_task          the demo world's task rows, once per (settings, seed)
    load_tasks             sources -> TaskRows (domain + environment resolved, ids unique)
    RLWiring               tokenizer, prompts, reward function: what the batch source, the profile
                           and the evaluation share
    profile_task           pass rate of every training prompt under the starting policy (k samples),
                           written once into the stage directory (a resume reads it back)
    heldout_eval_task      pass@1 (mean verifier result over samples at the rollout temperature) and
                           greedy accuracy per domain, logged under rl/<split>/ (eval/splits.py)
    rl_train_task          the engine's Trainer with GRPOObjective over RolloutBatches

Metric names: the objective's per-step values come out of the engine as `train/<name>`; the
ones that are RL's own (clip and masked-IS fractions, KL, entropy, the ratio) are logged as
`rl/<name>`, next to what the batch source measured (`rl/reward/<component>`, kept groups,
response length, rollout tokens/s).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import task

from stagewise.data.reasoning_switch import SwitchSetting
from stagewise.data.rl_rows import RLRow
from stagewise.eval.environments import get_environment
from stagewise.eval.heldout import end_ids
from stagewise.eval.rewards import group_rewards
from stagewise.tasks.policy import once, retrying, run_logger
from stagewise.store.refs import CheckpointRef
from stagewise.store.steps import cached, step_hash
from stagewise.store.tracking import Tracker

RL_DATA_VERSION = 1
RL_OBJECTIVE_METRICS = ("pg_loss", "clip_fraction", "is_masked_fraction", "kl", "entropy", "ratio_mean")


@dataclass(frozen=True)
class TaskRow:
    """One row with what the stage resolved for it."""

    id: str
    domain: str
    environment: str
    row: RLRow


# --------------------------------------------------------------------------- rows

@task(**retrying("rl-world"))
def rl_world_task(world, entities: int, seed: int, workdir: str) -> str:
    """Write the demo world's RL rows once per (settings, seed); returns the directory."""
    from stagewise.data.atomic import building
    from stagewise.data.world.rl_rows import generate_rl_world

    key = step_hash("rl_world", {"world": world, "entities": entities, "seed": seed, "version": RL_DATA_VERSION})
    out = Path(workdir) / "rl_world" / key
    if (out / "rl_eval.jsonl").is_file():
        return cached(str(out), key, f"RL world: reused {out}")
    with building(out) as tmp:
        generate_rl_world(tmp, seed, world.per_domain, world.eval_fraction, entities, world.max_digits,
                          tuple(world.format_kinds) if world.format_kinds else None)
    run_logger().info("RL world written to %s", out)
    return str(out)


def load_tasks(path: Path, name: str, domain: str | None, environment: str | None,
               on_bad_line: str = "error",
               missing_environment: str = "give the source an `environment`") -> list[TaskRow]:
    """Rows of one file with domain (source > row > name) and environment (source > row) resolved;
    `missing_environment` says how the caller names an environment for rows that carry none."""
    from stagewise.data.errors import BadInput
    from stagewise.data.rl_rows import read_rows
    from stagewise.eval.environments import get_environment

    out = []
    for i, row in enumerate(read_rows(path, on_bad_line=on_bad_line), start=1):
        env = environment or (row.model_extra or {}).get("environment")
        if not env:
            raise BadInput(f"{path}: row {i}: no environment: {missing_environment} "
                           "or the row an \"environment\" key")
        get_environment(env)
        out.append(TaskRow(id=f"{name}:{row.id if row.id is not None else i}", domain=domain or row.domain or name,
                           environment=env, row=row))
    return out


# --------------------------------------------------------------------------- wiring

def _say_unsaid_reasoning(tokenizer: Any, switch: SwitchSetting, reasoning: bool) -> None:
    """A warning in the run log when the template has no reasoning switch: `reasoning` cannot be
    said to the model, so its prompts take the template's default (which may think, or not)."""
    from stagewise.data.reasoning_switch import NoSwitch, resolve_switch

    if isinstance(resolve_switch(tokenizer, switch), NoSwitch):
        run_logger().warning("the chat template has no reasoning switch: reasoning %s cannot be said to the model, "
                             "so its prompts render as the template's default; name the model's switch in "
                             "tokenizer.reasoning_switch", "on" if reasoning else "off")


class RLWiring:
    """What rollouts, profile and evaluation share: the tokenizer, prompts and the reward function.

    Prompts are written by the checkpoint's own template with reasoning said by its own switch
    (`switch`: the recipe's tokenizer.reasoning_switch; data/chat.py chat_text)."""

    def __init__(self, tokenizer: Any, rows: list[TaskRow], rewards, reasoning: bool, switch: SwitchSetting = "auto"):
        from stagewise.data.chat import chat_text
        from stagewise.data.rl_rows import prompt_messages
        from stagewise.model.rl_batches import Prompt

        self.tokenizer, self.rewards = tokenizer, rewards
        _say_unsaid_reasoning(tokenizer, switch, reasoning)
        self.end = set(end_ids(tokenizer)) | ({tokenizer.pad_token_id} if tokenizer.pad_token_id is not None else set())
        self.rows = {r.id: r for r in rows}
        self.prompts = {}
        for r in rows:
            text = chat_text(prompt_messages(r.row), tokenizer, r.row.responses_create_params.tools, reasoning,
                             add_generation_prompt=True, switch=switch, name=f"RL row {r.id!r}")
            self.prompts[r.id] = Prompt(r.id, r.domain, tuple(tokenizer(text, add_special_tokens=False).input_ids))

    def text(self, response_ids: list[int]) -> str:
        """The completion a verifier reads: the response without its end token, with the reasoning
        and tool-call markers kept (they are special tokens: skipping them would glue a trace to
        its answer and hide every tool call)."""
        ids = list(response_ids)
        while ids and ids[-1] in self.end:
            ids.pop()
        return self.tokenizer.decode(ids, skip_special_tokens=False).strip()

    def score(self, prompt, group) -> dict[str, list[float]]:
        task_row = self.rows[prompt.id]
        texts = [self.text(r.response_ids) for r in group]
        return group_rewards(texts, [len(r.response_ids) for r in group], task_row.row,
                             get_environment(task_row.environment), self.rewards)


def by_domain(results: dict[str, list[float]], wiring: RLWiring) -> dict[str, float]:
    """Mean verifier result per domain and over all prompts (each prompt weighs the same)."""
    per: dict[str, list[float]] = {}
    for pid, values in results.items():
        per.setdefault(wiring.prompts[pid].domain, []).append(sum(values) / len(values))
    out = {d: sum(v) / len(v) for d, v in sorted(per.items())}
    every = [x for v in per.values() for x in v]
    out["all"] = sum(every) / len(every) if every else 0.0
    return out


# --------------------------------------------------------------------------- tasks

@task(**once("rl-profile"))
def profile_task(out_dir: str, generator, wiring: RLWiring, ids: list[str], samples: int, max_new_tokens: int,
                 temperature: float, seed: int, tracker: Tracker, run_id: str) -> dict[str, float]:
    """Pass rate of every training prompt under the starting policy, stored in `<out_dir>/profile.json`.

    The file is written before training starts, so a resumed run reads the very profile the
    interrupted one trained with (its curriculum depends on it)."""
    from stagewise.model.rl_batches import pass_rates

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
    from stagewise.eval.plots import pass_rate_histogram

    per: dict[str, list[float]] = {}
    for pid, rate in rates.items():
        per.setdefault(wiring.prompts[pid].domain, []).append(rate)
    tracker.log_json(run_id, {"samples": samples, "pass_rates": rates}, "rl/profile.json")
    tracker.log_figure(run_id, pass_rate_histogram(per, samples), "rl/profile_pass_rates.png")


@dataclass(frozen=True)
class ScoresCache:
    """Where a held-out evaluation's scores are kept, and which weights the generator holds.

    An evaluation is a content-addressed step too: `<root>/heldout-<hash>/scores.json`, the hash over
    the weights' sha256, the prompts (ids, token ids, rows), samples, tokens, temperature, seed and
    the generator kind (and its precision when it samples in bf16: rollout.sampler_precision). The
    same checkpoint scored the same way twice (RL's start and distillation's student are both SFT's
    checkpoint) is scored once; the second asks and reads the file."""

    root: str
    weights: str

    def path(self, generator, wiring: RLWiring, ids: list[str], settings: list) -> Path:
        prompts = [[i, list(wiring.prompts[i].ids), wiring.rows[i].environment,
                    wiring.rows[i].row.model_dump(mode="json")] for i in ids]
        spec = {"weights": self.weights, "prompts": prompts, "settings": settings,
                "generator": type(generator).__name__, "version": RL_DATA_VERSION}
        precision = getattr(generator, "precision", "trainer")  # a bf16 sampler scores other numbers
        if precision != "trainer":
            spec["precision"] = precision
        return Path(self.root) / f"heldout-{step_hash('heldout', spec)}" / "scores.json"


@task(**once("rl-heldout"))
def heldout_eval_task(generator, wiring: RLWiring, ids: list[str], samples: int, max_new_tokens: int,
                      temperature: float, seed: int, tracker: Tracker, run_id: str, at: tuple[int, int],
                      prefix: str = "rl/test", cache: ScoresCache | None = None) -> dict[str, float]:
    """pass@1 and greedy accuracy per domain on the held-out prompts, logged as `<prefix>/pass_at_1/<domain>`
    and `<prefix>/greedy/<domain>` at `at` = (step, tokens); read from `cache` when these weights were
    scored this way before."""
    path = cache.path(generator, wiring, ids, [samples, max_new_tokens, temperature, seed]) if cache else None
    if path is not None and path.is_file():
        scores = json.loads(path.read_text())
        run_logger().info("%s: held-out scores of these weights read from %s (scored before)", prefix, path.parent)
    else:
        scores = heldout_scores(generator, wiring, ids, samples, max_new_tokens, temperature, seed)
        if path is not None:  # written whole or not at all: a temporary sibling, then renamed
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp-{os.getpid()}-{threading.get_ident()}")
            tmp.write_text(json.dumps(scores))
            tmp.replace(path)
    metrics = {f"{prefix}/{kind}/{d}": v for kind, per in scores.items() for d, v in per.items()}
    tracker.log_metrics(run_id, [(at[0], at[1], metrics)])
    return metrics


def heldout_scores(generator, wiring: RLWiring, ids: list[str], samples: int, max_new_tokens: int,
                   temperature: float, seed: int) -> dict[str, dict[str, float]]:
    """{"pass_at_1": per domain, "greedy": per domain} of the prompts `ids` (no logging, no cache:
    heldout_eval_task and eval/task_rows.py add what each needs)."""
    from stagewise.model.rl_batches import pass_rates

    prompts = [wiring.prompts[i] for i in ids]
    sampled = by_domain(pass_rates(generator, prompts, wiring.score, samples, max_new_tokens, temperature, seed),
                        wiring)
    greedy = by_domain(pass_rates(generator, prompts, wiring.score, 1, max_new_tokens, 0.0, seed), wiring)
    return {"pass_at_1": sampled, "greedy": greedy}


@task(**once("rl-train"))
def rl_train_task(trainer, batches, resume_from: str | None, tracker: Tracker, run_id: str) -> CheckpointRef:
    """Train GRPO steps until the stage's budget (from `resume_from` when given); save; return the checkpoint."""
    from stagewise.model.checkpoint import read_meta

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


def rl_metric_log(tracker: Tracker, run_id: str, prefix: str = "rl"):
    """The engine's log callback: RL's own objective values renamed from train/<x> to <prefix>/<x>."""
    def log(records: list[tuple[int, int, dict[str, float]]]) -> None:
        renamed = []
        for step, tokens, metrics in records:
            renamed.append((step, tokens, {(f"{prefix}/{k[6:]}" if k.startswith("train/") and k[6:] in RL_OBJECTIVE_METRICS
                                            else k): v for k, v in metrics.items()}))
        tracker.log_metrics(run_id, renamed)
    return log
