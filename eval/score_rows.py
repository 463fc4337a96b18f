"""Score any checkpoint on task rows: the RL stage's held-out scorer, for users (`stagewise eval --rows`).

A team's question before (or instead of) an RL run is "how often does this checkpoint already
solve my rows?". The answer here is the very number the RL stage logs for each split as `rl/<split>/...`:

    pass_at_1/<domain>   mean verifier result over `samples` responses per prompt at `temperature`
                         (each prompt weighs the same), and over all prompts as `all`
    greedy/<domain>      the one temperature-0 answer's verifier result
    pass_at_1_interval/<domain>   pass@1's 95% interval over the prompts (eval/intervals.py)

Rows are NeMo Gym-style (data/rl_rows.py: keys this project does not know are kept and ignored);
each names its verifier in an `environment` key, or `environment` here names one for every row.
A row's domain is its `domain` key, else the file's stem. Prompts are rendered with the
checkpoint's own chat template (ours only where it carries none), as the RL stage renders them.
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from stagewise.data.chat import install_chat_template
from stagewise.data.reasoning_switch import SwitchSetting
from stagewise.eval.heldout import end_ids, round_robin
from stagewise.eval.intervals import rate_interval
from stagewise.eval.rewards import RewardConfig
from stagewise.eval.rl_scoring import ITEMS, heldout_scores
from stagewise.eval.rl_wiring import RLWiring, load_rows
from stagewise.model.build import load_model
from stagewise.model.rollout.hf import HFGenerator


def score_rows(checkpoint: str | Path, rows: str | Path, *, samples: int = 8, max_new_tokens: int = 32,
               temperature: float = 1.0, seed: int = 0, reasoning: bool = False, environment: str | None = None,
               limit: int | None = None, device: str = "cpu", switch: SwitchSetting = "auto") -> dict:
    """pass@1 and greedy accuracy per domain of `checkpoint` on the rows of `rows` (at most `limit`
    prompts, taken round-robin over the domains). BadInput (exit 2 in the CLI) for a bad row, a row
    without an environment, or an unknown environment, before the model loads."""
    path = Path(rows)
    resolved = load_rows(path, path.name.split(".")[0], None, environment, missing_environment="give --environment NAME")
    resolved = round_robin(resolved, lambda t: t.domain, limit)
    tokenizer = install_chat_template(AutoTokenizer.from_pretrained(str(checkpoint)))
    wiring = RLWiring(tokenizer, resolved, RewardConfig(), reasoning, switch)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    generator = HFGenerator(load_model(str(checkpoint), device=device), end_ids(tokenizer), pad_id, device=device)
    scores = heldout_scores(generator, wiring, [t.id for t in resolved], samples, max_new_tokens, temperature, seed)
    per_prompt = scores.pop(ITEMS)["pass_at_1"]
    by_domain: dict[str, list[float]] = {"all": list(per_prompt.values())}
    for t in resolved:
        by_domain.setdefault(t.domain, []).append(per_prompt[t.id])
    scores["pass_at_1_interval"] = {d: list(rate_interval(v)) for d, v in sorted(by_domain.items())}
    prompts: dict[str, int] = {}
    for t in resolved:
        prompts[t.domain] = prompts.get(t.domain, 0) + 1
    return {**scores, "prompts": dict(sorted(prompts.items()))}
