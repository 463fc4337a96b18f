"""One entry of an eval suite: which task, on which local files, and whether through the chat template.

    world_lookup                  a local task of eval/benchmarks/ (or its tag, `world`)
    gsm8k@evaldata/gsm8k          a standard lm-eval task, its dataset replaced by the files in a folder
    chat:gsm8k@evaldata/gsm8k     the same, its prompts rendered by the model's own chat template

Why a string and not a mapping: a suite travels as `list[str]` through every stage's inputs,
Prefect task parameters and `stagewise eval --tasks`, so the folder and the chat mode ride in
the entry itself and nothing between the recipe and eval/harness.py has to know about them.
The folder is relative to the current directory, like `workdir`, and holds one file per split
the task reads (eval/local_data.py); eval/standard_tasks.py checks it against the task.
Parsing reads no file.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

CHAT_PREFIX = "chat:"
"""An entry starting with this runs through the chat template (lm-eval's apply_chat_template)."""
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
"""What lm-eval's task, tag and group names are made of."""
SYNTAX = "TASK, TASK@FOLDER or chat:TASK@FOLDER"


class TaskSpec(BaseModel):
    """A parsed suite entry."""

    model_config = ConfigDict(frozen=True)

    name: str
    """The task (or tag) name lm-eval knows it by; its metrics are reported under it."""
    data: str | None = None
    """The folder of local split files that replaces a standard task's dataset (as written)."""
    chat: bool = False
    """Render each prompt (few-shot turns included) with the tokenizer's chat template."""

    @property
    def text(self) -> str:
        """The entry as written in a suite."""
        return f"{CHAT_PREFIX if self.chat else ''}{self.name}{'@' + self.data if self.data else ''}"


def parse_task(text: str) -> TaskSpec:
    """A suite entry parsed; ValueError saying what is wrong with it (the recipe loader cites its line)."""
    if not isinstance(text, str):
        raise ValueError(f"a suite entry is a string ({SYNTAX}); got {text!r}")
    chat = text.startswith(CHAT_PREFIX)
    rest = text[len(CHAT_PREFIX):] if chat else text
    name, at, data = rest.partition("@")
    if not NAME.fullmatch(name):
        raise ValueError(f"{text!r} is not a task entry: write {SYNTAX} (task names use letters, digits, _ . -)")
    if at and not data.strip():
        raise ValueError(f"{text!r}: give the folder of the task's data files after @ ({SYNTAX})")
    return TaskSpec(name=name, data=data or None, chat=chat)


def check_entry(text: str) -> str:
    """The recipe schema's check of one suite entry: its syntax only (the files are checked by recipe/checks.py)."""
    parse_task(text)
    return text


SuiteEntry = Annotated[str, AfterValidator(check_entry)]
"""A suite entry in a typed config (the recipe's `eval` block): a string, its syntax checked."""
