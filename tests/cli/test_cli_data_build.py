"""`stagewise data build`: the corpus as Megatron indexed shards, --dry-run, and exit 2 on what cannot run."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from stagewise.cli import app
from tests.data.corpus.conftest import doc, write_corpus

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def recipe(tmp_path, tokenizer: dict, **build) -> str:
    write_corpus(tmp_path / "in")
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "corpus-cli", "workdir": str(tmp_path / "w"), "tokenizer": tokenizer,
                                    "data": {"sources": [{"name": "web", "path": "in/web"},
                                                         {"name": "books", "path": "in/books.parquet"}],
                                             "build": {"shard_mb": 0.002, **build}}}))
    return str(path)


def tokenizer(tmp_path) -> dict:
    from stagewise.data.tokenizer import train_bpe

    train_bpe([doc(i) for i in range(300)], 500).save_pretrained(tmp_path / "tok")
    return {"path": str(tmp_path / "tok")}


def test_builds_into_the_workdir_and_reports_per_source(tmp_path):
    r = recipe(tmp_path, tokenizer(tmp_path))
    out = run("data", "build", r, "--json")
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert got["out"] == str((tmp_path / "w" / "corpus").resolve())
    assert got["manifest"]["sources"]["web"]["rejected"] == {"repeated_lines": 1, "symbol_heavy": 1, "too_short": 1}
    assert got["report"]["units_written_now"] == got["report"]["units"] > 6
    text = run("data", "build", r)  # a rerun: every unit already written
    assert text.exit_code == 0 and "0 written now" in text.output and "web" in text.output


def test_dry_run_shows_the_units_and_the_curator_calls_and_writes_nothing(tmp_path):
    r = recipe(tmp_path, tokenizer(tmp_path), dedup={"engine": "curator", "num_perm": 112, "bands": 14})
    out = run("data", "build", r, "--dry-run")
    assert out.exit_code == 0, out.output
    assert "FuzzyDeduplicationWorkflow(" in out.output and "num_bands=14" in out.output
    assert "minhashes_per_band=8" in out.output and "cannot run here" in out.output
    as_json = json.loads(run("data", "build", r, "--dry-run", "--json").output)
    assert as_json["sources"]["web"] == {"files": 4, "units": as_json["sources"]["web"]["units"],
                                         "bytes": sum(p.stat().st_size for p in (tmp_path / "in" / "web").iterdir())}
    assert not (tmp_path / "w" / "corpus").exists()


def test_curator_where_it_cannot_run_and_no_tokenizer_are_exit_2_saying_what_to_do(tmp_path):
    r = recipe(tmp_path, tokenizer(tmp_path), dedup={"engine": "curator"})
    out = run("data", "build", r)
    assert out.exit_code == 2 and "data.build.dedup.engine: curator cannot run on this machine" in out.output
    bare = tmp_path / "bare"
    bare.mkdir()
    out = run("data", "build", recipe(bare, {"vocab_size": 300}))
    assert out.exit_code == 2 and "stagewise data prepare" in out.output
    out = run("data", "build", r, "--tokenizer", tmp_path / "nowhere")
    assert out.exit_code == 2 and "--tokenizer" in out.output
    out = run("data", "build", r, "--set", "data.build.dedup.engine=gpu")
    assert out.exit_code == 2 and "data.build.dedup.engine" in out.output
