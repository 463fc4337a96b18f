"""The data-build flow: the corpus build logged to an MLflow run of its own, checked against what was planted."""

from __future__ import annotations

import json

import pytest
from mlflow import MlflowClient

from stagewise.data.errors import BadInput
from stagewise.data.indexed_format import read_indexed
from stagewise.data.tokenizer import train_bpe
from stagewise.flows.data_build import data_build_flow
from tests.data.corpus.conftest import REJECTS, doc, write_corpus

RECIPE = """\
name: corpus-flow
workdir: {workdir}
tokenizer: {tokenizer}
data:
  sources:
    - {{name: web, path: in/web}}
    - {{name: books, path: in/books.parquet}}
"""


def _recipe(tmp_path, tokenizer: str):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.format(workdir=tmp_path / "w", tokenizer=tokenizer))
    return path


def test_the_build_is_logged_to_its_run_with_rejects_duplicates_and_tokens(tmp_path, open_forms):
    planted = write_corpus(tmp_path / "in")
    tok = tmp_path / "tok"
    train_bpe([doc(i) for i in range(300)], 500).save_pretrained(tok)
    out = data_build_flow(str(_recipe(tmp_path, f"{{path: {tok}}}")))
    client = MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / 'w' / 'mlflow.db').resolve()}")
    run = client.get_run(out["run_id"])
    metrics, corpus = run.data.metrics, tmp_path / "w" / "corpus"
    assert run.info.run_name == "data-build" and run.info.status == "FINISHED"
    assert run.data.tags["stagewise.corpus"] == str(corpus)
    for name in ("web", "books"):
        assert metrics[f"data/{name}/docs"] == planted.docs[name]
        assert metrics[f"data/{name}/duplicates/exact"] == planted.duplicates[name]["exact"]
        assert metrics[f"data/{name}/duplicates/near"] == planted.duplicates[name]["near"]
        assert metrics[f"data/{name}/kept"] == len(planted.expected[name])
        tokens = 0
        for split in ("train", "val"):  # the tokens logged are the tokens in the shards on disk
            for shard in json.loads((corpus / "corpus.json").read_text())["sources"][name][split]:
                tokens += int(sum(len(d) for d in read_indexed(corpus / shard["prefix"])))
        assert metrics[f"data/{name}/train_tokens"] + metrics[f"data/{name}/val_tokens"] == tokens > 0
    assert {k.rsplit("/", 1)[1]: v for k, v in metrics.items() if k.startswith("data/web/rejected/")} == \
        {reason: 1 for reason in REJECTS.values()}
    assert not any(k.startswith("data/books/rejected/") for k in metrics)
    assert metrics["data/build/tokens_per_s"] > 0 and metrics["data/build/units_written_now"] == metrics["data/build/units"]
    artifacts = {a.path for a in client.list_artifacts(out["run_id"], "corpus")}
    assert artifacts == {"corpus/corpus.json", "corpus/build_report.json"}


def test_with_no_tokenizer_yet_the_flow_fails_saying_what_to_run(tmp_path, open_forms):
    write_corpus(tmp_path / "in")
    with pytest.raises(BadInput, match="run `stagewise data prepare` on it first"):
        data_build_flow(str(_recipe(tmp_path, "{vocab_size: 300}")))
