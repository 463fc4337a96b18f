"""Teachers must share the student's tokenizer: a check before any distillation work.

On-policy distillation scores the student's own sampled token ids with each teacher
(A_t = log π_T(y_t) - log π_S(y_t) on the same id y_t), so a teacher whose ids mean other
strings, or whose chat markers sit at other ids, gives numbers that look fine and teach
nonsense. The stage therefore refuses to start unless every teacher's tokenizer is the
student's.

What "the same" means: loaded with transformers' AutoTokenizer, the vocabularies (get_vocab(),
added tokens included), the special tokens (all_special_tokens with their ids, and which
token is bos/eos/pad/...) and the chat template are equal. Files are compared byte-wise only
to say where a difference lives: a reformatted or reordered JSON file that loads to the same
tokenizer is not an error. A mismatch raises TokenizerMismatch (a BadInput: the CLI exits 2)
naming the teacher, its directory, the files that differ and what differs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from stagewise.data.errors import BadInput

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
"""The files a saved HF tokenizer may consist of (transformers >= 4.43 writes the chat template
to chat_template.jinja; older versions keep it in tokenizer_config.json)."""

SHOWN = 5
"""How many differing tokens a message lists."""


class TokenizerMismatch(BadInput):
    """A teacher's tokenizer is not the student's (the message says which, where and how)."""


def _load(path: Path, who: str) -> Any:
    if not path.is_dir():
        raise BadInput(f"{path}: the {who}'s tokenizer directory does not exist")
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        raise BadInput(f"{path}: cannot load the {who}'s tokenizer: {str(err).splitlines()[0]}") from None


def _summary(tok: Any) -> dict[str, Any]:
    """What must be equal: vocabulary, special tokens with ids and roles, chat template."""
    specials = {t: tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens}
    roles = dict(getattr(tok, "special_tokens_map", {}) or {})
    return {"vocab": tok.get_vocab(), "specials": specials, "roles": roles, "chat_template": tok.chat_template}


def _listed(items: list[Any]) -> str:
    if not items:
        return "none"
    shown = ", ".join(repr(i) for i in items[:SHOWN])
    return shown + (f" (+{len(items) - SHOWN} more)" if len(items) > SHOWN else "")


def _vocab_diff(student: dict[str, int], teacher: dict[str, int]) -> list[str]:
    if student == teacher:
        return []
    only_s = sorted(set(student) - set(teacher), key=student.get)
    only_t = sorted(set(teacher) - set(student), key=teacher.get)
    moved = sorted((t for t in set(student) & set(teacher) if student[t] != teacher[t]), key=student.get)
    parts = [f"vocab: {len(student)} vs {len(teacher)} entries"]
    if only_t:
        parts.append(f"only in the teacher: {_listed(only_t)}")
    if only_s:
        parts.append(f"only in the student: {_listed(only_s)}")
    if moved:
        parts.append(f"other ids for: {_listed([f'{t} {student[t]}->{teacher[t]}' for t in moved])}")
    return ["; ".join(parts)]


def _specials_diff(student: dict[str, Any], teacher: dict[str, Any]) -> list[str]:
    out = []
    if student["specials"] != teacher["specials"]:
        s, t = set(student["specials"].items()), set(teacher["specials"].items())
        out.append(f"special tokens (token, id) differ: only the student's: {_listed(sorted(s - t, key=str))}; "
                   f"only the teacher's: {_listed(sorted(t - s, key=str))}")
    if student["roles"] != teacher["roles"]:
        keys = sorted(set(student["roles"]) | set(teacher["roles"]))
        diff = [f"{k}: {student['roles'].get(k)!r} vs {teacher['roles'].get(k)!r}" for k in keys
                if student["roles"].get(k) != teacher["roles"].get(k)]
        out.append(f"special token roles differ: {'; '.join(diff)}")
    return out


def _template_diff(student: Any, teacher: Any) -> list[str]:
    if student == teacher:
        return []
    if student is None or teacher is None:
        return [f"chat template: {'the student' if student is None else 'the teacher'} has none"]
    if isinstance(student, str) and isinstance(teacher, str):
        at = next((i for i, (a, b) in enumerate(zip(student, teacher)) if a != b), min(len(student), len(teacher)))
        return [f"chat template differs ({len(student)} vs {len(teacher)} chars, first at char {at}: "
                f"{student[at:at + 30]!r} vs {teacher[at:at + 30]!r})"]
    return ["chat template differs"]


def _file_diff(student: Path, teacher: Path) -> list[str]:
    """The TOKENIZER_FILES that differ byte-wise or exist on one side only."""
    out = []
    for name in TOKENIZER_FILES:
        s, t = student / name, teacher / name
        if s.is_file() and t.is_file():
            if s.read_bytes() != t.read_bytes():
                out.append(name)
        elif s.is_file():
            out.append(f"{name} (only the student's)")
        elif t.is_file():
            out.append(f"{name} (only the teacher's)")
    return out


def check_same_tokenizer(student: str | Path, teachers: dict[str, str | Path]) -> None:
    """Raise TokenizerMismatch unless every teacher's tokenizer equals the student's (see the
    module docstring); BadInput when a directory does not hold a loadable tokenizer."""
    student = Path(student)
    reference = _summary(_load(student, "student"))
    problems = []
    for name, directory in teachers.items():
        directory = Path(directory)
        if directory.resolve() == student.resolve():
            continue
        got = _summary(_load(directory, f"teacher {name!r}"))
        what = (_vocab_diff(reference["vocab"], got["vocab"]) + _specials_diff(reference, got)
                + _template_diff(reference["chat_template"], got["chat_template"]))
        if not what:
            continue
        files = _file_diff(student, directory)
        where = f"files that differ: {', '.join(files)}" if files else "no tokenizer file differs byte-wise"
        problems.append(f"teacher {name!r} ({directory}): {where}; {'; '.join(what)}")
    if problems:
        raise TokenizerMismatch(problems, title=f"teachers must use the student's tokenizer ({student}):")
