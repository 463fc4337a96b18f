"""Assembling one SFT stage's data on disk: curated sources, a chat-model start checkpoint,
and per sub-stage a blend sample (plus a share of the previous one) packed into rows.

    summary = curate_sources(paths, sources, CurateConfig(), tmp, final)     # <name>.jsonl, reports
    make_chat_start(pretrained_ckpt, tmp)                                    # template + <|im_end|> eos
    doc = blend_and_pack(files, domains, blend, seq_length=1024, seed=3, tokenizer_dir=start, out=tmp,
                         previous_sample=prev / "sample.jsonl", keep_share=0.2)
    check_enough_packs(doc["packing"], seq_length=1024, global_batch=8)

Plain Python: no Prefect, no MLflow. The caller (tasks/sft_data.py) chooses the directory
(named by a digest of the inputs) and writes into it atomically (data/atomic.py); these
functions only fill a directory they are given, so a notebook gets exactly what the SFT
stage trains on.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

from stagewise.data.chat import install_chat_template_dir, turn_end_token
from stagewise.data.content_hash import step_hash
from stagewise.data.curate import CurationError, curate
from stagewise.data.digest import file_sha256
from stagewise.data.reasoning_switch import SwitchSetting
from stagewise.data.row_files import read_jsonl as rows
from stagewise.data.sft_blend import sample_blend
from stagewise.data.sft_config import CurateConfig, PackingConfig, SFTBlend, SFTDataSource
from stagewise.data.sft_packs import pack_conversations, save_packed
from stagewise.data.sft_rows import CurationInput

IM_END = "<|im_end|>"
"""The chat template's end of turn: a chat model's generation stops there."""
TOKENIZER_FILES = ("tokenizer", "chat_template", "special_tokens")
"""Name prefixes of the files that decide how a conversation is tokenized."""


class SFTDataError(ValueError):
    """SFT data that cannot train a sub-stage (too few packs, an empty sample): what to change."""


# --------------------------------------------------------------------------- small pure pieces

def keep_previous(previous: list[tuple[str, dict]], share: float, seed: int) -> list[tuple[str, dict]]:
    """round(share x len(previous)) of the previous sample's (domain, conversation)s, seeded, no
    repeats, in the previous sample's order (a later sub-stage rehearses what came before)."""
    n = round(share * len(previous))
    if n <= 0:
        return []
    order = np.random.default_rng([seed, 0x4B50]).permutation(len(previous))[:n]
    return [previous[i] for i in sorted(order)]


def realised_mixture(domains: list[str], kept_previous: int) -> dict[str, float]:
    """Share of each domain in the final sample, plus `kept_previous` (the share carried over)."""
    total = max(len(domains), 1)
    out = {d: n / total for d, n in Counter(domains).items()}
    out["kept_previous"] = kept_previous / total
    return dict(sorted(out.items()))


def chat_eos(generation_config: dict, im_end_id: int) -> dict:
    """generation_config with <|im_end|> among the eos ids (a chat model's turn ends there)."""
    eos = generation_config.get("eos_token_id")
    ids = [] if eos is None else list(eos) if isinstance(eos, list) else [eos]
    if im_end_id not in ids:
        ids.append(im_end_id)
    return {**generation_config, "eos_token_id": ids}


def read_jsonl(path: str | Path) -> list[dict]:
    """The rows of a JSONL file this data path wrote (curated sources, samples, rejects)."""
    return [row.data for row in rows(Path(path))]


def write_jsonl(path: Path, rows: list) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def read_sample(path: str | Path) -> list[tuple[str, dict]]:
    """A packed sub-stage's sample.jsonl as (domain, conversation) pairs."""
    return [(row["domain"], row["conversation"]) for row in read_jsonl(path)]


def tokenizer_files(tokenizer_dir: str | Path) -> list[Path]:
    """The files of a tokenizer directory that decide tokenization (what a pack digest covers)."""
    return [p for p in sorted(Path(tokenizer_dir).glob("*")) if p.is_file() and p.name.startswith(TOKENIZER_FILES)]


def tokenizer_digest(tokenizer_dir: str | Path) -> str:
    """A hash of the files that decide how the tokenizer tokenizes (what a step over its tokens depends on)."""
    return step_hash("tokenizer", [file_sha256(Path(p)) for p in tokenizer_files(tokenizer_dir)])


def pack_seed(seed: int, index: int) -> int:
    """The seed sub-stage `index` samples, packs and picks its reasoning-off conversations with
    (what an engine that re-reads the sample must use to pick the same ones)."""
    return seed + index


# --------------------------------------------------------------------------- curation

def curate_sources(paths: Mapping[str, Path], sources: Sequence[SFTDataSource], cfg: CurateConfig,
                   out: Path, final: Path | None = None, drop_reasoning: bool = False) -> dict[str, dict]:
    """Curate every source into `out`: `<name>.jsonl` (kept), `<name>.rejects.jsonl`,
    `<name>.report.json` and `summary.json` ({name: report}); returns the summary.

    `paths` are the sources' resolved paths: a file or directory of any row format, read as
    conversations by data/sft_rows.py (a row that is no conversation raises BadInput naming
    file, row and field). Each reject names `where` its row is (`file:line`, `file:row i`).
    `final` is the directory `out` becomes once complete (data/atomic.py; default `out`):
    reports name their rejects there. A source above its max_reject_rate raises
    CurationError; as `out` is then about to be removed, the failed source's rejects are first
    copied to `<final>.failed/` and the error points at that copy. With `drop_reasoning` (the SFT
    data's `reasoning_content: drop`) every conversation loses its traces as it is read."""
    final = final or out
    reports = {}
    for s in sources:
        rejects = out / f"{s.name}.rejects.jsonl"
        lines = CurationInput(paths[s.name], s, drop_reasoning)
        try:
            report = curate(lines, cfg, rejects, source=s.name, max_reject_rate=s.max_reject_rate)
        except CurationError as err:
            locate_rejects(rejects, lines)
            raise keep_rejects(err, rejects, failed_rejects(final, s.name).parent) from None
        locate_rejects(rejects, lines)
        write_jsonl(out / f"{s.name}.jsonl", report.kept)
        reports[s.name] = {**report.to_dict(), "rejects_path": str(final / rejects.name)}
        (out / f"{s.name}.report.json").write_text(json.dumps(reports[s.name], indent=2))
    (out / "summary.json").write_text(json.dumps(reports, indent=2))
    return reports


def locate_rejects(rejects: Path, lines) -> None:
    """Add to every reject of `rejects` the `where` of its row (curate numbers the lines of a
    source's stream; `lines` is the CurationInput it read, which maps them back)."""
    rows = [{**row, "where": lines.where(row["line"])} for row in read_jsonl(rejects)]
    write_jsonl(rejects, rows)


def failed_rejects(final: Path, source: str) -> Path:
    """Where a failed curation keeps source `source`'s rejects: `<final>.failed/<source>.rejects.jsonl`."""
    return final.with_name(f"{final.name}.failed") / f"{source}.rejects.jsonl"


def keep_rejects(err: CurationError, rejects: Path, failed_dir: Path) -> CurationError:
    """The CurationError again, pointing at a copy of the rejects under `failed_dir` (the path
    is in the message: `... rejects in <path>`), so the evidence outlives a failed attempt."""
    keep = failed_dir / rejects.name
    keep.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(rejects, keep)
    reasons = Counter(row["reason"] for row in read_jsonl(keep))
    return CurationError(err.source, err.rate, err.limit, dict(reasons), keep)


# --------------------------------------------------------------------------- the chat-model start

def make_chat_start(src: Path, out: Path) -> None:
    """Fill `out` with checkpoint `src` as a chat model: the same weights (hard-linked when the
    filesystem allows), the chat template installed in its tokenizer, <|im_end|> among
    generation_config's eos ids. `src` itself is never edited."""
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"SFT start checkpoint {src} is not a checkpoint directory (no config.json)")
    for f in sorted(src.iterdir()):
        if f.is_file():
            _link_or_copy(f, out / f.name)
    install_chat_template_dir(out)
    set_chat_eos(out)


def _link_or_copy(src: Path, dst: Path) -> None:
    if src.suffix == ".safetensors":  # weights are never written in place, so sharing them is safe
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


def set_chat_eos(ckpt: Path) -> None:
    """Add the template's turn-end token (data.chat.turn_end_token: <|im_end|> for ours) to `ckpt`'s
    generation_config.json eos ids (no-op when the template ends turns in no added token)."""
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    end = turn_end_token(tok)
    im_end = tok.convert_tokens_to_ids(end) if end else None
    if not isinstance(im_end, int) or im_end < 0 or im_end == tok.unk_token_id:
        return
    path = ckpt / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps(chat_eos(config, im_end), indent=2) + "\n")


# --------------------------------------------------------------------------- blend and pack

def blend_and_pack(files: Mapping[str, str], domains: Mapping[str, str], blend: SFTBlend, seq_length: int,
                   seed: int, tokenizer_dir: str | Path, out: Path, previous_sample: str | Path | None = None,
                   keep_share: float = 0.0, switch: SwitchSetting = "auto") -> dict:
    """Sample `blend` from the curated `files` (source -> JSONL, weighed under `domains[source]`),
    add `keep_share` of `previous_sample`, render with the tokenizer's chat template (reasoning
    turned off through `switch`, data.reasoning_switch) and best-fit pack into rows of `seq_length` tokens.

    Writes `out/rows.npz`, `out/sample.jsonl` ({"domain", "conversation"} per line: the next
    sub-stage's previous sample) and `out/report.json`, and returns the report:
    {"packing", "blend", "kept_previous", "mixture"}."""
    pools: dict[str, list[dict]] = {}
    for name, path in files.items():
        pools.setdefault(domains[name], []).extend(read_jsonl(path))
    sampled = sample_blend(pools, blend.weights, seed, n=blend.conversations, max_epochs=blend.max_epochs)
    kept = keep_previous(read_sample(previous_sample), keep_share, seed) if previous_sample else []
    sample = list(zip(sampled.domains, sampled.conversations)) + kept
    if not sample:
        raise SFTDataError("the blend sampled no conversations")
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    packed = pack_conversations([c for _, c in sample], tok, PackingConfig(pack_size=seq_length),
                                blend.reasoning_off_fraction, seed, switch)
    save_packed(out / "rows.npz", packed.rows)
    write_jsonl(out / "sample.jsonl", [{"domain": d, "conversation": c} for d, c in sample])
    report = {"packing": packed.to_dict(), "blend": sampled.to_dict(), "kept_previous": len(kept),
              "mixture": realised_mixture([d for d, _ in sample], len(kept))}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    return report


def check_enough_packs(packing: Mapping, seq_length: int, global_batch: int) -> None:
    """SFTDataError unless the packs fill at least one global batch (else the sub-stage cannot take a step)."""
    if packing["packs"] < global_batch:
        raise SFTDataError(f"{packing['packs']} packs of {seq_length} tokens, "
                           f"fewer than one global batch ({global_batch}); raise blend.conversations or "
                           "lower global_batch")
