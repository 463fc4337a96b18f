"""Our RL stage against TRL's GRPOTrainer: held-out pass@1 gained per minute of training, from one
SFT checkpoint, on the same rows, rewards and wall-clock budget.

    python benchmarks/rl_vs_trl.py [--checkpoint DIR] [--rows DIR] [--budget-s 150] [--set KEY=VALUE] [--json]

Both trainers start from the same checkpoint (loaded afresh for each), train on the same RL rows
(the demo world's arithmetic and JSON-answer sums, drawn 0.6 / 0.4 as the demo recipe does), with
the same reward (eval/rl_wiring.py's RLWiring: the rows' verifiers, accuracy 1 + format 0.1), the same
group size, prompts per rollout batch, optimizer steps per rollout batch, learning rate (constant,
AdamW, no weight decay), response length and temperature, for the same wall-clock budget: each
stops at its first optimizer step past `--budget-s` seconds from the start of training.

- ours: the RL stage's pieces as the stage wires them (flows/rl.py `_on_torch`: data/rl_sampler's
  sampler, model/rl_batches' RolloutBatches, model/objectives/grpo's GRPOObjective, model/trainer's
  Trainer, the config from the block's `steps_train_config`), with the recipe's `stages.rl` block: leave-one-out
  advantages without std scaling, groups without reward variance dropped (dynamic sampling), each
  rollout batch trained as `minibatches` steps (shortest rows first, padding cut), π_old the
  trainer's at the sampling weights, masked IS, clip 0.2 / 0.28, no KL.
- TRL (`trl.GRPOTrainer`, 1.13), its settings closest to ours: loss_type "dapo" (token-level sum
  over the batch's response tokens / their count, as ours), epsilon 0.2 / epsilon_high 0.28,
  beta 0, scale_rewards "none" (Dr. GRPO: no std; its baseline is the group mean with the sample
  itself, ours leaves it out: the same direction, G/(G-1) larger), generation_batch_size =
  prompts x G with steps_per_generation = minibatches (one generation, that many optimizer steps,
  as ours), num_iterations 1, its own `model.generate` sampling (use_vllm False). TRL keeps every
  group: a group without reward variance has advantage 0 and still counts in the token
  denominator.
- Neither profiles difficulty first (the demo's `filter`): it would cost both the same rollouts
  before training starts and is not what is compared.

Afterwards both are scored the same way on the `test` split of the held-out rows (eval/splits.py,
the recipe's seed; the rows no tuning read): pass@1 = the mean verifier result over
`--heldout-samples` samples per prompt at the training temperature, each prompt weighing the same,
with our HF generator. Reported: pass@1 before and after, the gain per minute of training
(`gain_per_minute`), optimizer steps, rollout + train tokens/s, and `gain_per_minute_ratio` (ours
over TRL's). One seed per run: the held-out figures carry ~0.02 of sampling noise at ~300 prompts,
which on a gain of 0.1 is ~20% of the ratio; repeat with --seed to see the spread.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from rl_throughput import add_demo_inputs, default_rows, newest  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402


class OutOfTime(StopIteration):
    """Ends our Trainer's fit like a data source that ran dry (its stop reason `data_exhausted`)."""


class Setup:
    """What both trainers share: the recipe's RL block, tokenizer, rows, prompts, reward, test split."""

    def __init__(self, args: argparse.Namespace):
        from transformers import AutoTokenizer

        from stagewise.data.chat import install_chat_template
        from stagewise.data.rl_rows import prompt_key
        from stagewise.eval.heldout import end_ids
        from stagewise.eval.rl_wiring import RLWiring, load_rows
        from stagewise.eval.splits import split_rows
        from stagewise.recipe.loader import load_recipe

        loaded = load_recipe(args.recipe, args.set)
        self.seed = loaded.recipe.seed if args.seed is None else args.seed
        self.block = loaded.recipe.stages.rl
        self.ratios = dict(self.block.domains)
        self.tokenizer = AutoTokenizer.from_pretrained(str(args.checkpoint))
        if not self.tokenizer.chat_template:
            install_chat_template(self.tokenizer)
        train = [r for d in self.ratios for r in load_rows(args.rows / f"rl_{d}.jsonl", d, None, None)]
        heldout = [r for r in load_rows(args.rows / "rl_eval.jsonl", "heldout", None, None) if r.domain in self.ratios]
        test = split_rows(heldout, lambda r: prompt_key(r.row), loaded.recipe.seed)["test"]
        self.wiring = RLWiring(self.tokenizer, train + test, self.block.rewards, reasoning=False)
        self.by_domain: dict[str, list[tuple[str, float]]] = {}
        for r in train:
            self.by_domain.setdefault(r.domain, []).append((r.id, 0.5))
        self.train_ids = [r.id for r in train]
        self.test_ids = [r.id for r in test]
        self.end_ids = end_ids(self.tokenizer)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0


def score_test(model, setup: Setup, args, device: torch.device) -> dict[str, float]:
    """pass@1 per domain and over all test prompts (each prompt weighs the same)."""
    from stagewise.eval.rl_wiring import by_domain
    from stagewise.model.rl_batches import pass_rates
    from stagewise.model.rollout import make_generator

    ro = setup.block.rollout
    generator = make_generator("hf", model, setup.end_ids, setup.pad_id, device=device)
    prompts = [setup.wiring.prompts[i] for i in setup.test_ids]
    with torch.no_grad():
        results = pass_rates(generator, prompts, setup.wiring.score, args.heldout_samples, ro.max_new_tokens,
                             ro.temperature, setup.seed)
    return by_domain(results, setup.wiring)


def run_ours(setup: Setup, args, device: torch.device, workdir: Path) -> tuple[torch.nn.Module, dict]:
    """Our RL stage's loop for the budget; the trained policy and what it did."""
    from stagewise.data.rl_sampler import CurriculumSampler
    from stagewise.model.build import load_model
    from stagewise.model.objectives.grpo import GRPOObjective
    from stagewise.model.rl_batches import RolloutBatches
    from stagewise.model.rollout import make_generator
    from stagewise.model.runtime import RuntimeConfig, resolve_runtime
    from stagewise.model.train_spec import make_trainer

    block, ro = setup.block, setup.block.rollout.model_copy(update={"off_policy": False})
    policy = load_model(args.checkpoint, device=device)
    generator = make_generator("hf", policy, setup.end_ids, setup.pad_id, device=device)
    sampler = CurriculumSampler(setup.by_domain, setup.ratios, block.prompts_per_step, block.steps // ro.minibatches,
                                None, setup.seed)
    batches = RolloutBatches(policy, generator, setup.wiring.prompts, sampler, setup.wiring.score, ro, setup.seed,
                             setup.pad_id)
    runtime = resolve_runtime(RuntimeConfig(device=device.type, precision="fp32" if device.type == "cpu" else "auto"))
    cfg = block.model_copy(update={"steps": 100_000, "checkpoint_every_steps": None}).steps_train_config(
        setup.wiring.prompts, runtime)
    records: list[dict[str, float]] = []
    clock = {"start": None}

    class Budgeted:
        """The rollout batches, ending the fit at the first step asked for past the budget."""

        def next_batch(self):
            if clock["start"] is None:
                clock["start"] = time.perf_counter()
            elif time.perf_counter() - clock["start"] >= args.budget_s:
                raise OutOfTime
            return batches.next_batch()

    def log(rows) -> None:
        records.extend(dict(metrics) for _, _, metrics in rows)

    trainer = make_trainer(policy, cfg, Budgeted(), GRPOObjective(block.loss), out_dir=workdir / "ours", stage="rl",
                           tokenizer_dir=str(args.checkpoint), recipe_hash="bench", log=log, device=device,
                           progress=False)
    with trainer:
        try:
            trainer.fit()
        finally:
            batches.close()
    wall = time.perf_counter() - clock["start"]
    generated = sum(m["rl/response_length"] * m["rl/groups"] * ro.group_size for m in records if "rl/groups" in m)
    return policy, {"steps": len(records), "wall_s": wall, "tokens_per_s": (generated + batches.trained_tokens) / wall}


def run_trl(setup: Setup, args, device: torch.device, workdir: Path) -> tuple[torch.nn.Module, dict]:
    """TRL's GRPOTrainer with the closest settings (module docstring) for the budget."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from stagewise.data.chat import turn_end_token
    from stagewise.eval.environments import get_environment
    from stagewise.eval.rewards import group_rewards
    from stagewise.model.build import load_model

    block, ro = setup.block, setup.block.rollout
    rng = torch.Generator().manual_seed(setup.seed)
    rows = []  # the domains in the recipe's ratio: every row of the scarcest, the others cut to match
    per_unit = min(len(ids) / setup.ratios[d] for d, ids in setup.by_domain.items())
    for d, ids in setup.by_domain.items():
        take = torch.randperm(len(ids), generator=rng)[: int(per_unit * setup.ratios[d])].tolist()
        for i in take:
            pid = ids[i][0]
            rows.append({"prompt": setup.tokenizer.decode(setup.wiring.prompts[pid].ids), "prompt_id": pid})

    generated = {"tokens": 0}

    def reward(prompts, completions, completion_ids, prompt_id, **_) -> list[float]:
        out = []
        for text, ids, pid in zip(completions, completion_ids, prompt_id):
            generated["tokens"] += len(ids)
            task = setup.wiring.rows[pid]
            text = setup.wiring.text(ids)  # as ours: end tokens cut, special markers kept
            out.append(group_rewards([text], [len(ids)], task.row, get_environment(task.environment),
                                     block.rewards)["total"][0])
        return out

    clock: dict[str, float] = {}
    steps = {"n": 0}

    class Budget(TrainerCallback):
        def on_train_begin(self, *a, **k):
            clock["start"] = time.perf_counter()

        def on_step_end(self, _args, state, control, **k):
            steps["n"] = state.global_step
            if time.perf_counter() - clock["start"] >= args.budget_s:
                control.should_training_stop = True

    samples = block.prompts_per_step * ro.group_size
    config = GRPOConfig(
        output_dir=str(workdir / "trl"), use_cpu=device.type == "cpu", seed=setup.seed, report_to="none",
        learning_rate=block.optimizer.lr, lr_scheduler_type="constant", weight_decay=block.optimizer.weight_decay,
        max_steps=100_000, save_strategy="no", logging_steps=1_000_000, disable_tqdm=True,
        num_generations=ro.group_size, generation_batch_size=samples,
        per_device_train_batch_size=samples // ro.minibatches,  # so steps_per_generation = minibatches
        gradient_accumulation_steps=1, num_iterations=1,
        max_completion_length=ro.max_new_tokens, temperature=ro.temperature, top_k=0, top_p=1.0,
        loss_type="dapo", epsilon=block.loss.eps_low, epsilon_high=block.loss.eps_high, beta=block.loss.kl_coeff,
        scale_rewards="none", mask_truncated_completions=False, use_vllm=False,
        router_aux_loss_coef=0.0,  # as ours: RL trains no load-balancing loss (steps_train_config)
        bf16=False, dataloader_num_workers=0)
    # TRL ends a completion (and its loss mask) at the tokenizer's eos: ours is the turn end, as the
    # chat template closes an assistant turn (else the padding after it would be trained on)
    tokenizer = copy.deepcopy(setup.tokenizer)
    tokenizer.eos_token = turn_end_token(tokenizer) or tokenizer.eos_token
    policy = load_model(args.checkpoint, device=device)
    trainer = GRPOTrainer(model=policy, reward_funcs=[reward], args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer, callbacks=[Budget()])
    for quiet in (PrinterCallback, ProgressCallback):  # they print its log dicts to stdout (this script's JSON)
        trainer.remove_callback(quiet)
    trainer.train()
    wall = time.perf_counter() - clock["start"]
    trained = trainer.model
    trained.eval()
    # each completion is trained once (num_iterations 1), groups without variance included
    return trained, {"steps": steps["n"], "wall_s": wall, "tokens_per_s": 2 * generated["tokens"] / wall}


def run(args) -> dict:
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    hf_logging.set_verbosity_error()
    setup = Setup(args)
    from stagewise.model.build import load_model

    before = score_test(load_model(args.checkpoint, device=device), setup, args, device)
    out = {"device": str(device), "threads": torch.get_num_threads(), "checkpoint": str(args.checkpoint),
           "rows": str(args.rows), "budget_s": args.budget_s, "seed": setup.seed,
           "group_size": setup.block.rollout.group_size, "prompts_per_step": setup.block.prompts_per_step,
           "minibatches": setup.block.rollout.minibatches, "lr": setup.block.optimizer.lr,
           "test_prompts": len(setup.test_ids), "heldout_samples": args.heldout_samples,
           "before": before, "trainers": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in (("ours", run_ours), ("trl", run_trl)):
            torch.manual_seed(setup.seed)
            model, stats = fn(setup, args, device, Path(tmp))
            after = score_test(model, setup, args, device)
            stats.update(after=after, gain=after["all"] - before["all"],
                         gain_per_minute=(after["all"] - before["all"]) / (stats["wall_s"] / 60))
            out["trainers"][name] = stats
            del model
    ours, trl = out["trainers"]["ours"], out["trainers"]["trl"]
    out["gain_per_minute_ratio"] = ours["gain_per_minute"] / trl["gain_per_minute"] if trl["gain_per_minute"] > 0 else None
    out["cpu_count"], out["load_avg_1m"] = os.cpu_count(), os.getloadavg()[0]
    return out


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"RL for {r['budget_s']:.0f} s from one SFT checkpoint: G={r['group_size']} x "
                        f"{r['prompts_per_step']} prompts, {r['minibatches']} steps per rollout batch, lr {r['lr']:g}, "
                        f"{r['device']}, {r['threads']} threads")
    for name in ("trainer", "steps", "train s", "test pass@1 before", "after", "gain", "gain / min"):
        table.add_column(name, justify="left" if name == "trainer" else "right")
    for name, t in r["trainers"].items():
        table.add_row(name, str(t["steps"]), f"{t['wall_s']:.0f}", f"{r['before']['all']:.3f}",
                      f"{t['after']['all']:.3f}", f"{t['gain']:+.3f}", f"{t['gain_per_minute']:+.4f}")
    console = Console(width=120) if not Console().is_terminal else Console()
    console.print(table)
    ratio = r["gain_per_minute_ratio"]
    console.print(f"gain per minute, ours / TRL: {ratio:.2f}x" if ratio is not None else
                  "TRL gained nothing on test: no ratio")
    console.print(f"(test split: {r['test_prompts']} prompts, pass@1 over {r['heldout_samples']} samples each)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_demo_inputs(p)
    p.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "tiny.yaml",
                   help="the recipe whose stages.rl block both trainers follow")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a recipe override, e.g. stages.rl.prompts_per_step=16 (repeatable)")
    p.add_argument("--budget-s", type=float, default=150.0, help="training wall-clock per trainer")
    p.add_argument("--heldout-samples", type=int, default=8, help="samples per test prompt for pass@1")
    p.add_argument("--seed", type=int, default=None, help="default: the recipe's")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = p.parse_args(argv)
    if args.checkpoint is None:
        args.checkpoint = newest("runs/tiny/stages/sft-stage2-*/step-*")
    if args.rows is None:
        args.rows = default_rows()
    if args.checkpoint is None or not (args.checkpoint / "config.json").is_file():
        print("no SFT checkpoint (run `stagewise demo` first, or give --checkpoint DIR)", file=sys.stderr)
        return 2
    if args.rows is None:
        print("no RL rows (run `stagewise demo` first, or give --rows DIR)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    print(json.dumps(result, indent=1)) if args.json else print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
