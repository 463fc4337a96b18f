"""Near dedup through NeMo Curator's GPU fuzzy dedup (`data.build.dedup.engine: curator`).

    plan = curator_plan(units, dedup, work)      what would run (pure: `stagewise data build --dry-run` prints it)
    stage_unit(unit, filters, drops, work)       a unit's documents left after filters and exact dedup, as parquet
    dropped = run_curator(plan)                  Curator's two workflows, then which (unit, ordinal) it removed

Why a plan first: Curator's fuzzy dedup imports cuDF at module top, so on a machine without a GPU and RAPIDS
nothing of it can even be imported (measured with nemo-curator 1.4.0). What it would be asked to do is still
ours to get right, so it is written as data, checked by tests on any machine, and executed by `run_curator`
only where `curator_missing()` is None.

The calls, in order:
1. `FuzzyDeduplicationWorkflow(cache_path, output_path, input_path=[staged parquet, plan order],
   input_filetype="parquet", text_field="text", seed, char_ngrams, num_bands, minhashes_per_band,
   bands_per_iteration).run(executor=RayActorPoolExecutor())`: MinHash, LSH, connected components; the ids of
   every document but one per group, in `<output_path>/FuzzyDuplicateIds/`, and its id generator in
   `<output_path>/fuzzy_id_generator.json` (none of either when it finds no candidates).
2. `TextDuplicatesRemovalWorkflow(input_path=[the same files], ids_to_remove_path, id_generator_path,
   duplicate_id_field="_curator_dedup_id", output_path, output_fields=["stagewise_doc"]).run()`: the staged files
   again, the removed ids dropped; each staged row carries `stagewise_doc` = unit << 32 | ordinal, so what
   survives maps back to our documents with no reliance on how Curator numbers them.
3. dropped = staged - kept.

Curator keeps one document per group, not necessarily the earliest, so the builtin and curator engines may
keep different copies; only the builtin engine promises byte-identical output across executors.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from stagewise.data.atomic import write_file
from stagewise.data.corpus.config import CorpusDedupConfig, FilterConfig
from stagewise.data.corpus.filters import reject_reason
from stagewise.data.corpus.plan import WorkUnit
from stagewise.data.corpus.read import UnitReader
from stagewise.data.curate.minhash import optimal_bands

FUZZY = "nemo_curator.stages.deduplication.fuzzy.workflow.FuzzyDeduplicationWorkflow"
REMOVAL = "nemo_curator.stages.text.deduplication.removal_workflow.TextDuplicatesRemovalWorkflow"
EXECUTOR = "nemo_curator.backends.experimental.ray_actor_pool.RayActorPoolExecutor"
CURATOR_ID = "_curator_dedup_id"
"""The column Curator's id generator adds and its duplicate-id files hold."""
DOC_ID = "stagewise_doc"
"""Our column on every staged row: unit << 32 | ordinal."""


def doc_key(unit: int, ordinal: int) -> int:
    return unit << 32 | ordinal


def curator_missing() -> str | None:
    """Why Curator's fuzzy dedup cannot run here, or None when it can (Curator, cuDF and a CUDA GPU present)."""
    if importlib.util.find_spec("nemo_curator") is None:
        return "nemo-curator is not installed (pip install 'nemo-curator[deduplication_cuda12]')"
    if importlib.util.find_spec("cudf") is None:
        return "cuDF (RAPIDS) is not installed: Curator's fuzzy dedup imports it (its deduplication_cuda12 extra)"
    import torch  # noqa: PLC0415  (only asked once Curator and cuDF are there)

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    return None


def staged_path(work: str, unit: WorkUnit) -> Path:
    return Path(work) / "curator" / "input" / f"{unit.name}.parquet"


def curator_plan(units: list[WorkUnit], dedup: CorpusDedupConfig, work: str) -> dict:
    """The Curator calls near dedup makes for these units (see the module docstring), as JSON-ready data."""
    bands = dedup.bands or optimal_bands(dedup.threshold, dedup.num_perm)
    root = Path(work) / "curator"
    inputs = [str(staged_path(work, u)) for u in units]
    output = str(root / "fuzzy")
    return {
        "fuzzy": {"class": FUZZY, "executor": EXECUTOR, "kwargs": {
            "cache_path": str(root / "cache"), "output_path": output, "input_path": inputs,
            "input_filetype": "parquet", "text_field": "text", "seed": dedup.minhash_seed,
            "char_ngrams": dedup.char_ngrams, "num_bands": bands, "minhashes_per_band": dedup.num_perm // bands,
            "bands_per_iteration": min(5, bands)}},
        "removal": {"class": REMOVAL, "kwargs": {
            "input_path": inputs, "ids_to_remove_path": f"{output}/FuzzyDuplicateIds",
            "id_generator_path": f"{output}/fuzzy_id_generator.json", "duplicate_id_field": CURATOR_ID,
            "input_filetype": "parquet", "output_filetype": "parquet", "output_path": str(root / "kept"),
            "output_fields": [DOC_ID]}},
    }


def stage_unit(unit: WorkUnit, filters: FilterConfig, drops: list[int], work: str) -> dict:
    """Write the unit's documents that pass the filters and survived exact dedup (`drops`: the ordinals it
    dropped) as parquet (text, stagewise_doc) for Curator; {unit, path, docs}. Done once: a rerun reads it back."""
    path = staged_path(work, unit)
    if path.is_file():
        return {"unit": unit.id, "path": str(path), "docs": pq.ParquetFile(path).metadata.num_rows}
    dropped = set(drops)
    texts, keys = [], []
    for ordinal, text in UnitReader(unit):
        if ordinal not in dropped and reject_reason(text, filters) is None:
            texts.append(text)
            keys.append(doc_key(unit.id, ordinal))
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": pa.array(texts, pa.string()), DOC_ID: pa.array(keys, pa.int64())}), buf)
    write_file(path, buf.getvalue())
    return {"unit": unit.id, "path": str(path), "docs": len(keys)}


def _doc_ids(files: list[str | Path]) -> set[int]:
    out: set[int] = set()
    for f in files:
        out.update(pq.read_table(f, columns=[DOC_ID]).column(DOC_ID).to_pylist())
    return out


def dropped_docs(staged: list[str], kept_dir: Path | None) -> dict[tuple[int, int], str]:
    """(unit, ordinal) -> "near" for every staged document not among those the removal workflow wrote to
    `kept_dir` (None: Curator found no candidates, nothing is dropped)."""
    if kept_dir is None:
        return {}
    gone = _doc_ids(staged) - _doc_ids(sorted(Path(kept_dir).rglob("*.parquet")))
    return {(key >> 32, key & 0xFFFFFFFF): "near" for key in sorted(gone)}


def _made(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def run_curator(plan: dict) -> dict[tuple[int, int], str]:
    """Run the plan's two workflows (only where curator_missing() is None); the documents they removed.

    Their result is kept (`curator/dropped.json`), so a rerun after a crash in the write phase does not run
    Curator again; a crash inside Curator reruns both workflows from scratch (on the staged files, which stay).
    Not exercised on this project's CPU machines (nothing of Curator's fuzzy dedup imports there): the plan it
    runs is what the tests check."""
    fuzzy, removal = plan["fuzzy"], plan["removal"]
    done = Path(fuzzy["kwargs"]["output_path"]).parent / "dropped.json"
    if done.is_file():
        return {(u, o): "near" for u, o in json.loads(done.read_text())}
    for key in ("cache_path", "output_path"):
        shutil.rmtree(fuzzy["kwargs"][key], ignore_errors=True)
    shutil.rmtree(removal["kwargs"]["output_path"], ignore_errors=True)
    _made(fuzzy["class"])(**fuzzy["kwargs"]).run(executor=_made(fuzzy["executor"])())
    kept = None
    if Path(removal["kwargs"]["id_generator_path"]).is_file():  # none: no candidate pairs, nothing removed
        _made(removal["class"])(**removal["kwargs"]).run()
        kept = Path(removal["kwargs"]["output_path"])
    dropped = dropped_docs(removal["kwargs"]["input_path"], kept)
    write_file(done, json.dumps(sorted(dropped)).encode())
    return dropped
