"""RL rows as the stages use them: rows with their domain and verifier resolved, rendered into
prompts by the checkpoint's own template, completions scored by their verifiers.

    load_rows     a source file -> ResolvedRows (domain and environment resolved, ids unique)
    RLWiring      tokenizer, prompts and reward function: what the batch source, the difficulty
                  profile and the held-out evaluation share
    by_domain     mean verifier result per domain and over all prompts

The RL and distillation stages, `stagewise eval --rows` (eval/score_rows.py) and the benchmarks
all wire rows this way, so a prompt is rendered and a completion scored the same everywhere.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stagewise.data.chat import chat_text
from stagewise.data.errors import BadInput
from stagewise.data.reasoning_switch import NoSwitch, SwitchSetting, resolve_switch
from stagewise.data.rl_rows import RLRow, prompt_messages, read_rows
from stagewise.eval.environments import get_environment
from stagewise.eval.heldout import end_ids
from stagewise.eval.rewards import group_rewards
from stagewise.model.rl_batches import Prompt

log = logging.getLogger(__name__)

RL_DATA_VERSION = 1
"""Bump when the way RL rows are generated or scored changes (new world and held-out score directories)."""


@dataclass(frozen=True)
class ResolvedRow:
    """One RL row with what the stage resolved for it: its unique id, domain and verifier."""

    id: str
    domain: str
    environment: str
    row: RLRow


def load_rows(path: Path, name: str, domain: str | None, environment: str | None,
              on_bad_line: str = "error",
              missing_environment: str = "give the source an `environment`") -> list[ResolvedRow]:
    """Rows of one file with domain (source > row > name) and environment (source > row) resolved;
    `missing_environment` says how the caller names an environment for rows that carry none."""
    out = []
    for i, row in enumerate(read_rows(path, on_bad_line=on_bad_line), start=1):
        env = environment or (row.model_extra or {}).get("environment")
        if not env:
            raise BadInput(f"{path}: row {i}: no environment: {missing_environment} "
                           "or the row an \"environment\" key")
        get_environment(env)
        out.append(ResolvedRow(id=f"{name}:{row.id if row.id is not None else i}", domain=domain or row.domain or name,
                               environment=env, row=row))
    return out


def _say_unsaid_reasoning(tokenizer: Any, switch: SwitchSetting, reasoning: bool) -> None:
    """A warning in the run log when the template has no reasoning switch: `reasoning` cannot be
    said to the model, so its prompts take the template's default (which may think, or not)."""
    if isinstance(resolve_switch(tokenizer, switch), NoSwitch):
        log.warning("the chat template has no reasoning switch: reasoning %s cannot be said to the model, "
                    "so its prompts render as the template's default; name the model's switch in "
                    "tokenizer.reasoning_switch", "on" if reasoning else "off")


class RLWiring:
    """What rollouts, profile and evaluation share: the tokenizer, prompts and the reward function.

    Prompts are written by the checkpoint's own template with reasoning said by its own switch
    (`switch`: the recipe's tokenizer.reasoning_switch; data/chat.py chat_text)."""

    def __init__(self, tokenizer: Any, rows: list[ResolvedRow], rewards, reasoning: bool,
                 switch: SwitchSetting = "auto"):
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
        resolved = self.rows[prompt.id]
        texts = [self.text(r.response_ids) for r in group]
        return group_rewards(texts, [len(r.response_ids) for r in group], resolved.row,
                             get_environment(resolved.environment), self.rewards)


def by_domain(results: dict[str, list[float]], wiring: RLWiring) -> dict[str, float]:
    """Mean verifier result per domain and over all prompts (each prompt weighs the same)."""
    per: dict[str, list[float]] = {}
    for pid, values in results.items():
        per.setdefault(wiring.prompts[pid].domain, []).append(sum(values) / len(values))
    out = {d: sum(v) / len(v) for d, v in sorted(per.items())}
    every = [x for v in per.values() for x in v]
    out["all"] = sum(every) / len(every) if every else 0.0
    return out
