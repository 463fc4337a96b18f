"""Test-wide settings: quiet, offline, deterministic, and no stray MLflow/Prefect state."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("MLFLOW_TRACKING_URI", "sqlite:////tmp/stagewise-tests-unused.db")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A randomly initialised `tiny` model and its BPE tokenizer saved as an HF directory (CLI, eval tests)."""
    from data.tokenizer import train_bpe
    from data.world.arithmetic import arithmetic_texts
    from model.build import build_model
    from model.config import ModelConfig

    path = tmp_path_factory.mktemp("ckpt")
    tok = train_bpe(arithmetic_texts(50, 0), 300)
    build_model(ModelConfig(preset="tiny"), len(tok), seed=0).save_pretrained(path)
    tok.save_pretrained(path)
    return path
