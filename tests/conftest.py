"""Test-wide settings: quiet, offline, deterministic, and no stray MLflow/Prefect state."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("MLFLOW_TRACKING_URI", "sqlite:////tmp/stagewise-tests-unused.db")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Each xdist worker (and every stagewise it starts) gets its share of the cores, not all of them: two
# workers' torch processes each spinning two OpenMP threads on a 2-core machine ran a pretraining
# 2.1x slower than one thread each (225 s against 105 s for two concurrent 40-step runs, measured here).
# Read by torch at import, so set before anything imports it; inherited by the CLI subprocesses.
# Only in a worker: xdist's controller loads this file first and its workers inherit its environment.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _SHARE = len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _SHARE)))
# Each test process (an xdist worker, or the one pytest) keeps its Prefect state apart: the ephemeral
# API servers of two workers on one SQLite file would lock each other out.
_PREFECT_HOME = tempfile.mkdtemp(prefix=f"stagewise-tests-prefect-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
os.environ["PREFECT_HOME"] = _PREFECT_HOME
atexit.register(shutil.rmtree, _PREFECT_HOME, True)


import json  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A randomly initialised `tiny` model and its BPE tokenizer saved as an HF directory (CLI, eval tests)."""
    from stagewise.data.tokenizer import train_bpe
    from stagewise.data.world.arithmetic import arithmetic_texts
    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig

    path = tmp_path_factory.mktemp("ckpt")
    tok = train_bpe(arithmetic_texts(50, 0), 300)
    build_model(ModelConfig(preset="tiny"), len(tok), seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def open_forms(monkeypatch):
    """A served flow's form policy opened wide (any recipe, any override), for tests of what a flow does
    with its parameters once admitted; tests/deployments/test_form_policy.py tests the boundary itself."""
    from stagewise.recipe.form_policy import POLICY_ENV, FormPolicy

    monkeypatch.setenv(POLICY_ENV, FormPolicy(recipe_roots=["/"], allowed=["**"], tracking_uris=[]).model_dump_json())


@pytest.fixture(scope="session")
def chat_tokenizer_dir(tmp_path_factory):
    """A saved byte-level BPE (600 tokens, trained on demo-world conversations) with the
    special tokens of data/tokenizer.py and data/templates/chat.jinja installed."""
    from stagewise.data.chat import install_chat_template
    from stagewise.data.tokenizer import train_bpe
    from stagewise.data.world.conversations import DOMAINS, domain_conversations

    texts = [json.dumps(c) for d in DOMAINS if d != "long_context" for c in domain_conversations(d, 30, 0, 200)]
    tok = install_chat_template(train_bpe(texts, 600))
    out = tmp_path_factory.mktemp("chat_tokenizer")
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def chat_tokenizer(chat_tokenizer_dir):
    """The tokenizer of chat_tokenizer_dir, loaded back with AutoTokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(chat_tokenizer_dir)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which turns the markers into the groups it schedules by
def pytest_collection_modifyitems(items):
    """Groups for `--dist loadgroup` (python3 dev.py test runs two xdist workers): every test on the
    shared pretraining (tests/e2e/conftest.py tiny_pretrain), and on the stages later tests reuse from
    its workdir, in one worker, in file order; every test marked `vllm` in one group (they share the
    session's vLLM server), and counted `slow` too (as the megatron ones: tests/engines/conftest.py);
    every other slow or megatron test with the rest of its module, so a module-scoped pipeline run or
    side-environment process runs once, not once per worker."""
    for item in items:
        if item.get_closest_marker("vllm") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("xdist_group"):
            continue
        if item.get_closest_marker("vllm"):
            group = "vllm"
        elif "tiny_pretrain" in getattr(item, "fixturenames", ()):
            group = "tiny_pretrain"
        elif item.get_closest_marker("slow") or item.get_closest_marker("megatron"):
            group = item.nodeid.split("::")[0]
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))


def _slurm_cluster(tmp_path_factory, nodes: int):
    """A real Slurm cluster of `nodes` nodes (tests/slurm_cluster.py), or a skip (a failure under CI)."""
    from tests.slurm_cluster import missing_programs, slurm_cluster

    missing = missing_programs()
    if missing:
        why = f"no Slurm here ({', '.join(missing)} missing): apt-get install slurmctld slurmd slurm-client munge"
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
            pytest.fail(f"{why} (CI is set: .ci/run installs them, and the slurm tests must run)", pytrace=False)
        pytest.skip(why)
    return slurm_cluster(tmp_path_factory.mktemp(f"slurm-{nodes}-node"), nodes=nodes)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real two-node Slurm cluster (two slurmd daemons on this host, 8 fake GPUs each, EnforcePartLimits
    off), up for the session, SLURM_CONF pointing at it. Tests using it share one xdist group."""
    with _slurm_cluster(tmp_path_factory, 2) as cluster, pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
        yield cluster


@pytest.fixture
def slurm_one_node(tmp_path_factory, monkeypatch):
    """A real one-node Slurm cluster for one test (EnforcePartLimits off), SLURM_CONF pointing at it meanwhile."""
    with _slurm_cluster(tmp_path_factory, 1) as cluster:
        monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
        yield cluster


@pytest.fixture(scope="session")
def vllm_python():
    """vLLM's CPU build's interpreter ($STAGEWISE_VLLM_PYTHON, else .venv-vllm/bin/python; `python3 dev.py
    vllm-env`), exported as STAGEWISE_VLLM_PYTHON for what the tests start (a stage's own server,
    `stagewise serve-model`)."""
    from tests.side_envs import side_python

    python = side_python("vLLM", ".venv-vllm", "STAGEWISE_VLLM_PYTHON", "VLLM_STAMP", "vllm_pins_key", "VLLM_PINS",
                         "vllm-env")
    os.environ["STAGEWISE_VLLM_PYTHON"] = str(python)
    return python


@pytest.fixture(scope="session")
def dense_chat_checkpoint(chat_tokenizer_dir, tmp_path_factory):
    """A randomly initialised `tiny-dense` model (what vLLM's CPU build serves: no MoE layers) in fp32, saved
    with the session's chat tokenizer and our template."""
    from transformers import AutoTokenizer

    from stagewise.model.build import build_model
    from stagewise.model.config import ModelConfig

    out = tmp_path_factory.mktemp("dense-chat")
    tok = AutoTokenizer.from_pretrained(chat_tokenizer_dir)
    tok.save_pretrained(out)
    build_model(ModelConfig(preset="tiny-dense"), len(tok), seed=0).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def vllm_server(vllm_python, dense_chat_checkpoint, tmp_path_factory):
    """A real vLLM server (fp32, weight reload on) on dense_chat_checkpoint for the session's `vllm` tests
    (one xdist worker runs them all: pytest_collection_modifyitems groups them); stopped at the end.
    A test that needs particular weights loads them first (VLLMGenerator.sync_weights)."""
    from stagewise.model.vllm_server import VLLMServer

    server = VLLMServer(dense_chat_checkpoint, python=str(vllm_python), dtype="float32",
                        log_path=tmp_path_factory.mktemp("vllm") / "server.log").start()
    yield server
    server.stop()
