"""The Ray executor against real Ray: a local cluster the build starts, a two-node cluster started with
`ray start` (two raylets on this host), a SIGKILLed driver, and a cluster that cannot run the tasks.

Every build here must equal the in-process build of the same inputs byte for byte: the shards, the
manifest, the plan. One xdist group: each cluster takes the machine's cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from stagewise.data.corpus.build import build_corpus
from stagewise.data.corpus.config import CorpusBuildConfig
from tests.benchmarks.scripts import load_benchmark

pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

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


def recipe_for(corpus, tok, tmp_path, **build) -> Path:
    """A recipe next to the inputs (the same paths as the in-process build's) with these data.build keys."""
    recipe = corpus.base / f"recipe-{tmp_path.name}.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "corpus-ray", "workdir": str(tmp_path / "runs"), "tokenizer": {"path": str(tok)},
        "data": {"validation_fraction": 0.1, "sources": [s.model_dump(exclude_defaults=True) for s in corpus.sources],
                 "build": {"shard_mb": SHARD_MB, "executor": "ray", **build}}, "seed": 7}))
    return recipe


@pytest.fixture(scope="module")
def two_nodes():
    """A head and a second node, one CPU each, started with `ray start` (the benchmark's own way, so the test
    and the benchmark run one cluster setup) and stopped at the end; (address, the drivers' environment).

    The builds on it run as `stagewise data build` processes, as a user's would: a driver's Ray reads its
    auth mode once, so it must have RAY_AUTH_MODE=token from its start."""
    address, env, stop = load_benchmark("data_prep").two_node_cluster()
    try:
        yield address, env
    finally:
        stop()


def test_a_local_cluster_of_two_workers_writes_what_one_process_writes(corpus, corpus_tokenizer, tmp_path, in_process):
    result = build(corpus, corpus_tokenizer, tmp_path / "ray", executor="ray", ray={"workers": 2})
    assert result.report["executor"] == "ray" and result.report["units"] > 6
    assert outputs(tmp_path / "ray") == in_process


def test_a_two_node_cluster_writes_what_one_process_writes(corpus, corpus_tokenizer, tmp_path, in_process, two_nodes):
    address, env = two_nodes
    recipe = recipe_for(corpus, corpus_tokenizer, tmp_path, ray={"address": address, "workers": 2})
    run = subprocess.run([str(STAGEWISE), "data", "build", str(recipe), "--out", str(tmp_path / "ray2"), "--json"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout)["report"]["nodes"] == 2  # both raylets ran units
    assert outputs(tmp_path / "ray2") == in_process


def test_a_cluster_that_cannot_place_the_tasks_fails_naming_the_phase(corpus, corpus_tokenizer, tmp_path, two_nodes):
    address, env = two_nodes
    recipe = recipe_for(corpus, corpus_tokenizer, tmp_path, ray={"address": address, "cpus_per_worker": 2,
                                                                 "no_progress_s": 3})
    started = time.monotonic()
    run = subprocess.run([str(STAGEWISE), "data", "build", str(recipe), "--out", str(tmp_path / "never")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1, run.stderr[-3000:]
    assert re.search(r"Starved: corpus build: no scanning task finished in \d+ s .*no_progress_s=3", run.stderr)
    assert time.monotonic() - started < 60


def test_a_sigkilled_driver_is_resumed_redoing_only_unfinished_units(corpus, corpus_tokenizer, tmp_path, in_process):
    recipe = recipe_for(corpus, corpus_tokenizer, tmp_path, ray={"workers": 2})
    out = tmp_path / "killed"
    cmd = [str(STAGEWISE), "data", "build", str(recipe), "--out", str(out), "--json"]
    # its own session: Ray makes the driver the leader of a process group that its local cluster joins
    driver = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    done = out / ".work" / "done"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and len(list(done.glob("*.json")) if done.is_dir() else []) < 3:
        assert driver.poll() is None, "the build ended before it could be killed"
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    time.sleep(2)  # tasks in flight may still finish and write their units (atomically)
    # then what is left of its cluster goes too, so no unit is written after they are counted
    gone = time.monotonic() + 60
    with contextlib.suppress(ProcessLookupError):
        while time.monotonic() < gone:
            os.killpg(driver.pid, signal.SIGKILL)  # raises once the group is empty
            time.sleep(0.2)
    finished = len(list(done.glob("*.json")))
    assert not (out / "corpus.json").exists()
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    report = json.loads(rerun.stdout)["report"]
    assert report["units_written_before"] == finished >= 3, (finished, report)
    assert report["units_written_now"] == report["units"] - finished > 0, (finished, report)
    assert outputs(out) == in_process
