"""dedup.engine=curator: the Curator calls near dedup makes, the documents handed to them, and what comes back.

Curator's fuzzy dedup imports cuDF, so on these CPU machines nothing of it runs. What is tested here:
the plan (the workflows and arguments it would be called with, checked against the parameter names of
NeMo Curator's own signatures, written down below from its source on GitHub, 2026-12), the staged input (exactly the
documents left after filters and exact dedup, each with its key), the mapping of Curator's output back
to documents, the refusal where it cannot run, and the build's wiring through a STAND-IN for Curator
(`fake_curator`, which removes documents by a rule of its own the way the removal workflow would write
its output): the stand-in is what needs a GPU, not what is checked.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stagewise.data.corpus import curator
from stagewise.data.corpus.build import build_corpus, preview_corpus
from stagewise.data.corpus.config import CorpusBuildConfig, CorpusDedupConfig, FilterConfig
from stagewise.data.corpus.curator import DOC_ID, curator_plan, doc_key, dropped_docs, stage_unit
from stagewise.data.corpus.plan import make_plan, units_of
from stagewise.data.errors import BadInput

FUZZY_PARAMS = {  # FuzzyDeduplicationWorkflow.__init__ (nemo_curator/stages/deduplication/fuzzy/workflow.py)
    "cache_path", "output_path", "input_path", "input_filetype", "input_blocksize", "input_file_extensions",
    "read_kwargs", "cache_kwargs", "write_kwargs", "text_field", "perform_removal", "seed", "char_ngrams",
    "num_bands", "minhashes_per_band", "use_64_bit_hash", "bands_per_iteration", "env_vars"}
REMOVAL_PARAMS = {  # TextDuplicatesRemovalWorkflow's fields (nemo_curator/stages/text/deduplication/removal_workflow.py)
    "input_path", "ids_to_remove_path", "output_path", "input_filetype", "input_fields", "id_field",
    "input_files_per_partition", "input_blocksize", "input_file_extensions", "input_task_limit", "input_kwargs",
    "duplicate_id_field", "duplicate_id_read_kwargs", "id_generator_path", "id_generator_storage_options",
    "output_file_extension", "output_filetype", "output_kwargs", "output_fields", "output_mode", "drop_id_field"}


def units(corpus, shard_mb=0.002):
    return units_of(make_plan(corpus.sources, corpus.base, None, int(shard_mb * 1024**2)))


def test_the_plan_calls_curators_workflows_with_the_configured_lsh_and_every_staged_unit(corpus, tmp_path):
    found = units(corpus)
    dedup = CorpusDedupConfig(engine="curator", num_perm=112, bands=14, minhash_seed=9, char_ngrams=30)
    plan = curator_plan(found, dedup, str(tmp_path / "work"))
    fuzzy, removal = plan["fuzzy"], plan["removal"]
    assert fuzzy["class"].endswith("fuzzy.workflow.FuzzyDeduplicationWorkflow")
    assert removal["class"].endswith("removal_workflow.TextDuplicatesRemovalWorkflow")
    assert fuzzy["executor"].endswith("RayActorPoolExecutor")  # the only executor the fuzzy workflow accepts
    assert set(fuzzy["kwargs"]) <= FUZZY_PARAMS and set(removal["kwargs"]) <= REMOVAL_PARAMS
    k = fuzzy["kwargs"]
    assert (k["num_bands"], k["minhashes_per_band"], k["seed"], k["char_ngrams"]) == (14, 8, 9, 30)
    assert 1 <= k["bands_per_iteration"] <= k["num_bands"]  # Curator refuses anything else
    staged = [str(tmp_path / "work" / "curator" / "input" / f"part-{u.id:05d}.parquet") for u in found]
    assert k["input_path"] == staged == removal["kwargs"]["input_path"] and len(staged) > 6
    assert removal["kwargs"]["ids_to_remove_path"] == k["output_path"] + "/FuzzyDuplicateIds"
    assert removal["kwargs"]["id_generator_path"] == k["output_path"] + "/fuzzy_id_generator.json"
    assert removal["kwargs"]["duplicate_id_field"] == "_curator_dedup_id"  # the column its duplicate ids are in
    assert removal["kwargs"]["output_fields"] == [DOC_ID]
    default = curator_plan(found, CorpusDedupConfig(engine="curator"), "w")["fuzzy"]["kwargs"]
    assert default["num_bands"] * default["minhashes_per_band"] <= 128


def test_staged_input_is_what_survives_the_filters_and_exact_dedup_keyed_by_unit_and_ordinal(corpus, tmp_path):
    found = units(corpus)
    exact_dropped = {u.id: [] for u in found}
    for unit, ordinal in _exact_dropped(found):
        exact_dropped[unit].append(ordinal)
    assert sum(map(len, exact_dropped.values())) == sum(d["exact"] for d in corpus.duplicates.values())
    texts, keys = [], []
    for u in found:
        got = stage_unit(u, FilterConfig(), exact_dropped[u.id], str(tmp_path / "work"))
        table = pq.read_table(got["path"])
        assert got["docs"] == table.num_rows
        texts += table.column("text").to_pylist()
        keys += table.column(DOC_ID).to_pylist()
    assert texts == corpus.after_exact["web"] + corpus.after_exact["books"]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def _tok(tmp_path):
    from stagewise.data.tokenizer import train_bpe
    from tests.data.corpus.conftest import doc

    path = tmp_path / "tok"
    if not path.is_dir():
        train_bpe([doc(i) for i in range(300)], 500).save_pretrained(path)
    return path


def _exact_dropped(found) -> list[tuple[int, int]]:
    """(unit, ordinal) of every later copy of a text seen before (after case folding and whitespace), planted."""
    from stagewise.data.corpus.read import UnitReader
    from tests.data.corpus.conftest import REJECTS

    seen, out = set(), []
    for u in found:
        for ordinal, text in UnitReader(u):
            norm = " ".join(text.lower().split())
            if text in REJECTS:
                continue
            if norm in seen:
                out.append((u.id, ordinal))
            seen.add(norm)
    return out


def test_what_the_removal_workflow_did_not_keep_is_dropped(tmp_path):
    staged = tmp_path / "staged.parquet"
    keys = [doc_key(0, 1), doc_key(0, 4), doc_key(3, 2), doc_key(7, 0)]
    pq.write_table(pa.table({"text": ["a", "b", "c", "d"], DOC_ID: keys}), staged)
    (tmp_path / "kept").mkdir()
    pq.write_table(pa.table({DOC_ID: [keys[0], keys[2]]}), tmp_path / "kept" / "part.0.parquet")
    assert dropped_docs([str(staged)], tmp_path / "kept") == {(0, 4): "near", (7, 0): "near"}
    assert dropped_docs([str(staged)], None) == {}


def test_where_curator_cannot_run_the_build_refuses_it_before_any_work_and_the_preview_says_why(corpus, tmp_path):
    assert curator.curator_missing() is not None  # these CPU machines have no cuDF
    cfg = CorpusBuildConfig(dedup={"engine": "curator"})
    with pytest.raises(BadInput, match="data.build.dedup.engine: curator cannot run on this machine: .*--dry-run"):
        build_corpus(corpus.sources, corpus.base, None, _tok(tmp_path), cfg, 0.1, 7, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    preview = preview_corpus(corpus.sources, corpus.base, None, cfg, tmp_path / "out")
    assert preview["curator"]["missing"] == curator.curator_missing()
    assert preview["curator"]["plan"]["fuzzy"]["kwargs"]["input_path"][0].startswith(str(tmp_path / "out" / ".work"))
    assert preview["sources"]["web"]["files"] == 4 and preview["sources"]["books"]["files"] == 1
    assert not (tmp_path / "out").exists()
    assert preview_corpus(corpus.sources, corpus.base, None, CorpusBuildConfig(), tmp_path)["curator"] is None


@pytest.fixture
def fake_curator(monkeypatch):
    """A STAND-IN for NeMo Curator's two workflows (the real ones need a GPU and cuDF): the fuzzy one "finds"
    every staged document whose text mentions `slept` or `lake` (the planted near copies) and writes its id
    generator file; the removal one writes the other rows' keys, as the real one writes its output_fields."""
    calls = []

    class Fuzzy:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            calls.append(("fuzzy", kwargs))

        def run(self, executor):
            calls.append(("executor", type(executor).__name__))
            out = Path(self.kwargs["output_path"])
            out.mkdir(parents=True)
            (out / "fuzzy_id_generator.json").write_text("{}")

    class Removal:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            calls.append(("removal", kwargs))

        def run(self):
            out = Path(self.kwargs["output_path"])
            out.mkdir(parents=True)
            for i, f in enumerate(self.kwargs["input_path"]):
                t = pq.read_table(f)
                keep = [k for k, text in zip(t.column(DOC_ID).to_pylist(), t.column("text").to_pylist())
                        if "slept" not in text and " lake " not in text]
                pq.write_table(pa.table({DOC_ID: pa.array(keep, pa.int64())}), out / f"part.{i}.parquet")

    class RayActorPoolExecutor:
        """Stands in for Curator's executor: the fuzzy workflow's run() only receives it."""

    for dotted, obj in ((curator.FUZZY, Fuzzy), (curator.REMOVAL, Removal), (curator.EXECUTOR, RayActorPoolExecutor)):
        module, _, name = dotted.rpartition(".")
        fake = types.ModuleType(module)
        setattr(fake, name, obj)
        monkeypatch.setitem(sys.modules, module, fake)
    monkeypatch.setattr("stagewise.data.corpus.build.curator_missing", lambda: None)
    return calls


def test_the_build_drops_what_curator_removed_and_a_rerun_does_not_ask_it_again(corpus, tmp_path, fake_curator):
    cfg = CorpusBuildConfig(shard_mb=0.002, dedup={"engine": "curator"})
    out = tmp_path / "out"
    built = build_corpus(corpus.sources, corpus.base, None, _tok(tmp_path), cfg, 0.1, 7, out)
    assert [c[0] for c in fake_curator] == ["fuzzy", "executor", "removal"]
    assert fake_curator[1][1] == "RayActorPoolExecutor"
    near = {name: [t for t in corpus.after_exact[name] if "slept" in t or " lake " in t] for name in ("web", "books")}
    for name in ("web", "books"):
        s = built.manifest["sources"][name]
        assert len(near[name]) == 1
        assert s["duplicates"] == {"exact": corpus.duplicates[name]["exact"], "near": 1}
        assert s["kept"] == len(corpus.after_exact[name]) - 1
    dropped = json.loads((out / ".work" / "curator" / "dropped.json").read_text())
    assert len(dropped) == 2
    for record in (out / ".work" / "done").glob("*.json"):
        record.unlink()  # the write phase redone: Curator's result is read back, not recomputed
    fake_curator.clear()
    again = build_corpus(corpus.sources, corpus.base, None, _tok(tmp_path), cfg, 0.1, 7, out)
    assert fake_curator == [] and again.manifest == built.manifest
