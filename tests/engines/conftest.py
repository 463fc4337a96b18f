"""Fixtures of the engine tests. Tests get them through the fixtures, never `import conftest`."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def fake_megatron(tmp_path_factory):
    """The stand-in Megatron-Bridge (tests/engines/fake_engines/megatron.py): (venv, checkout)."""
    from tests.engines.fake_engines.megatron import make_fake_megatron

    return make_fake_megatron(tmp_path_factory.mktemp("fake-megatron"))


@pytest.fixture(scope="session")
def fake_nemo_rl(tmp_path_factory):
    """The stand-in NeMo RL (tests/engines/fake_engines/nemo_rl.py): (venv, checkout)."""
    from tests.engines.fake_engines.nemo_rl import make_fake_nemo_rl

    return make_fake_nemo_rl(tmp_path_factory.mktemp("fake-nemo-rl"))
