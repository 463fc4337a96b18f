"""Sources named by URL, read through fsspec: the planted corpus served over HTTP by a real server (aiohttp's
static files, with directory listings and range requests) and named by `file://`, built in process and on
Ray, must write the shards the local paths write. Protocols that cannot be read here are refused before any
work (exit 2), and the steps that read sources themselves refuse URLs naming the one that reads them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from stagewise.data.config import SourceConfig
from stagewise.data.corpus.build import build_corpus
from stagewise.data.corpus.config import CorpusBuildConfig
from stagewise.data.errors import BadInput
from stagewise.data.sources import SourceError, resolve_path

SHARD_MB = 0.004
STAGEWISE = Path(sys.executable).parent / "stagewise"
SERVE = """
import sys
from aiohttp import web
app = web.Application()
app.router.add_static("/", sys.argv[1], show_index=True)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=None)
"""


def shards(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted((root / "shards").rglob("*")) if p.is_file()}


def counts(root: Path) -> dict:
    """What corpus.json says of each source, less where it came from."""
    manifest = json.loads((root / "corpus.json").read_text())
    return {name: {k: v for k, v in s.items() if k not in ("path", "files")} for name, s in manifest["sources"].items()}


def build(sources, base, tok, out, **cfg):
    return build_corpus(sources, base, None, tok, CorpusBuildConfig(shard_mb=SHARD_MB, **cfg), 0.1, 7, out)


@pytest.fixture
def served(corpus):
    """The corpus's folder on an HTTP server on 127.0.0.1 (its own process); its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVE, str(corpus.base), str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the HTTP server did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait()


def url_sources(base_url: str) -> list[SourceConfig]:
    return [SourceConfig(name="web", path=f"{base_url}/web/part-*.jsonl"),
            SourceConfig(name="books", path=f"{base_url}/books.parquet")]


@pytest.fixture
def local(corpus, corpus_tokenizer, tmp_path):
    build(corpus.sources, corpus.base, corpus_tokenizer, tmp_path / "local")
    return tmp_path / "local"


def test_http_urls_write_the_shards_local_paths_write(corpus, corpus_tokenizer, tmp_path, served, local):
    out = tmp_path / "http"
    (corpus.base / "web" / ".part-tmp.jsonl").write_text('{"text": "a half-copied file"}\n')  # hidden: skipped
    result = build(url_sources(served), corpus.base, corpus_tokenizer, out)
    plan = json.loads((out / "plan.json").read_text())
    assert [f for f, _ in plan["files"]] == [f"{served}/web/part-{i:03d}.jsonl" for i in range(4)] + [
        f"{served}/books.parquet"]
    # the same units as the local paths' plan: JSONL cut by byte range (read with seeks), parquet by row group
    local_plan = json.loads((local / "plan.json").read_text())
    as_url = {str(corpus.base / "web" / f"part-{i:03d}.jsonl"): f"{served}/web/part-{i:03d}.jsonl" for i in range(4)}
    as_url[str(corpus.base / "books.parquet")] = f"{served}/books.parquet"
    assert plan["units"] == [{**u, "file": as_url[u["file"]]} for u in local_plan["units"]]
    assert sum(u["format"] == "jsonl" for u in plan["units"]) > 4 and sum(u["format"] == "parquet" for u in plan["units"]) > 1
    assert shards(out) == shards(local) and counts(out) == counts(local)
    assert result.manifest["sources"]["web"]["docs"] == corpus.docs["web"]


def test_file_urls_write_the_shards_local_paths_write(corpus, corpus_tokenizer, tmp_path, local):
    base = corpus.base.resolve().as_uri()
    out = tmp_path / "file"
    (corpus.base / "web" / ".part-tmp.jsonl").write_text('{"text": "a half-copied file"}\n')  # fsspec globs it; skipped
    build(url_sources(base), corpus.base, corpus_tokenizer, out)
    assert ".part-tmp" not in (out / "plan.json").read_text()
    assert shards(out) == shards(local) and counts(out) == counts(local)


@pytest.mark.slow
@pytest.mark.xdist_group("ray")
def test_ray_workers_read_the_urls_themselves(corpus, corpus_tokenizer, tmp_path, served, local):
    pytest.importorskip("ray")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "corpus-urls", "workdir": str(tmp_path / "runs"), "tokenizer": {"path": str(corpus_tokenizer)},
        "data": {"validation_fraction": 0.1, "sources": [s.model_dump(exclude_defaults=True) for s in url_sources(served)],
                 "build": {"shard_mb": SHARD_MB, "executor": "ray", "ray": {"workers": 2}}}, "seed": 7}))
    out = tmp_path / "ray"
    run = subprocess.run([str(STAGEWISE), "data", "build", str(recipe), "--out", str(out), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert shards(out) == shards(local) and counts(out) == counts(local)


@pytest.mark.parametrize(("path", "says"), [
    ("nosuch://bucket/web/*.jsonl", "fsspec knows no 'nosuch' protocol"),
    ("{served}/web/part-999.jsonl", "no such file"),
    ("{served}/missing/*.jsonl", "no files match"),
    ("{served}/web/part-000.jsonl.arrow", "a URL source reads JSONL and parquet files"),
])
def test_a_url_that_cannot_be_read_is_refused_before_any_work(corpus, corpus_tokenizer, tmp_path, served, path, says):
    (corpus.base / "web" / "part-000.jsonl.arrow").write_bytes(b"not read")
    with pytest.raises(BadInput, match=says):
        build([SourceConfig(name="web", path=path.format(served=served))], corpus.base, corpus_tokenizer, tmp_path / "o")
    assert not (tmp_path / "o" / "shards").exists()


def test_the_steps_that_read_sources_themselves_refuse_a_url_naming_data_build(tmp_path):
    with pytest.raises(SourceError, match=r"s3://b/x.jsonl: a URL; only `stagewise data build` reads sources by URL"):
        resolve_path("s3://b/x.jsonl", tmp_path, None)


def test_the_cli_refuses_an_unknown_protocol_with_exit_2(tmp_path, corpus_tokenizer):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "u", "workdir": str(tmp_path / "runs"),
                                      "tokenizer": {"path": str(corpus_tokenizer)},
                                      "data": {"sources": [{"name": "web", "path": "nosuch://b/*.jsonl"}]}}))
    run = subprocess.run([str(STAGEWISE), "data", "build", str(recipe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "nosuch://b/*.jsonl: fsspec knows no 'nosuch' protocol" in run.stderr
