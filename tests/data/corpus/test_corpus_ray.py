"""The Ray executor against real Ray: a local cluster the build starts, a two-node cluster started with
`ray start` (two raylets on this host), a SIGKILLed driver, and a cluster that cannot run the tasks.

Every build here must equal the in-process build of the same inputs byte for byte: the shards, the
manifest, the plan. One xdist group: each cluster takes the machine's cores.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from stagewise.data.corpus.build import build_corpus
from stagewise.data.corpus.config import CorpusBuildConfig
from stagewise.data.corpus.executors import Starved

pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

RAY = Path(sys.executable).parent / "ray"
SHARD_MB = 0.004
STAGEWISE = Path(sys.executable).parent / "stagewise"


def outputs(root: Path) -> dict[str, bytes]:
    """Everything a build leaves but its run report and working files."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".work" not in p.parts and p.name != "build_report.json"}


def build(corpus, tok, out, **cfg):
    return build_corpus(corpus.sources, corpus.base, None, tok, CorpusBuildConfig(shard_mb=SHARD_MB, **cfg), 0.1, 7, out)


@pytest.fixture
def in_process(corpus, corpus_tokenizer, tmp_path):
    build(corpus, corpus_tokenizer, tmp_path / "in_process")
    return outputs(tmp_path / "in_process")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A head and a second node, one CPU each, started with `ray start` and stopped at the end."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # both raylets and the driver must agree on token auth (ray 2.60 writes ~/.ray/auth_token itself)
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    temp = tmp_path_factory.mktemp("ray")
    common = ["--num-cpus", "1", "--object-store-memory", str(200 * 1024**2), "--disable-usage-stats"]
    head = [str(RAY), "start", "--head", "--port", str(port), "--include-dashboard", "false",
            "--temp-dir", str(temp), *common]
    try:
        subprocess.run(head, env=env, check=True, capture_output=True, timeout=120)
        subprocess.run([str(RAY), "start", "--address", f"127.0.0.1:{port}", *common], env=env, check=True,
                       capture_output=True, timeout=120)
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([str(RAY), "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_a_local_cluster_of_two_workers_writes_what_one_process_writes(corpus, corpus_tokenizer, tmp_path, in_process):
    result = build(corpus, corpus_tokenizer, tmp_path / "ray", executor="ray", ray={"workers": 2})
    assert result.report["executor"] == "ray" and result.report["units"] > 6
    assert outputs(tmp_path / "ray") == in_process


def test_a_two_node_cluster_writes_what_one_process_writes(corpus, corpus_tokenizer, tmp_path, in_process, two_nodes,
                                                         monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    result = build(corpus, corpus_tokenizer, tmp_path / "ray2", executor="ray",
                   ray={"address": two_nodes, "workers": 2})
    assert result.report["nodes"] == 2  # both raylets ran units
    assert outputs(tmp_path / "ray2") == in_process


def test_a_cluster_that_cannot_place_the_tasks_fails_naming_the_phase(corpus, corpus_tokenizer, tmp_path, two_nodes,
                                                                       monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    started = time.monotonic()
    with pytest.raises(Starved, match=r"no scanning task finished in \d+ s .*no_progress_s=3"):
        build(corpus, corpus_tokenizer, tmp_path / "never", executor="ray",
              ray={"address": two_nodes, "cpus_per_worker": 2, "no_progress_s": 3})
    assert time.monotonic() - started < 60


def test_a_sigkilled_driver_is_resumed_redoing_only_unfinished_units(corpus, corpus_tokenizer, tmp_path, in_process):
    recipe = corpus.base / "recipe.yaml"  # next to the inputs: the same paths as the in-process build's
    recipe.write_text(yaml.safe_dump({
        "name": "corpus-kill", "workdir": str(tmp_path / "runs"), "tokenizer": {"path": str(corpus_tokenizer)},
        "data": {"validation_fraction": 0.1, "sources": [s.model_dump(exclude_defaults=True) for s in corpus.sources],
                 "build": {"shard_mb": SHARD_MB, "executor": "ray", "ray": {"workers": 2}}}, "seed": 7}))
    out = tmp_path / "killed"
    cmd = [str(STAGEWISE), "data", "build", str(recipe), "--out", str(out), "--json"]
    driver = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done = out / ".work" / "done"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(list(done.glob("*.json")) if done.is_dir() else []) < 3:
        assert driver.poll() is None, "the build ended before it could be killed"
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    time.sleep(2)  # tasks in flight may still finish and write their units (atomically)
    finished = len(list(done.glob("*.json")))
    assert not (out / "corpus.json").exists()
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads(rerun.stdout)["report"]
    assert report["units_written_before"] == finished >= 3
    assert report["units_written_now"] == report["units"] - finished > 0
    assert outputs(out) == in_process
