"""Fixtures of the engine tests. Tests get them through the fixtures, never `import conftest`.

Besides the stand-in engines, the interpreters of the two side environments with released libraries:
tests marked `megatron` (the project's marker for side-environment tests) run code in `.venv-megatron`
(Megatron-Bridge, `python3 dev.py megatron-env`) or `.venv-gym` (NeMo Gym, `python3 dev.py gym-env`)
as subprocesses, `[python, script, args...]`, with the scripts of side_env/; nothing here imports
them. They are left out by default (pyproject.toml's addopts) and count as `slow` too, so
`-m "not slow"` leaves them out as well; `-m megatron` selects them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.side_envs import side_python as _side_python


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("megatron") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def megatron_python() -> Path:
    """The released Megatron-Bridge's interpreter ($STAGEWISE_MEGATRON_PYTHON, else .venv-megatron/bin/python)."""
    return _side_python("Megatron-Bridge", ".venv-megatron", "STAGEWISE_MEGATRON_PYTHON", "MEGATRON_STAMP",
                        "megatron_pins_key", "MEGATRON_PINS", "megatron-env")


@pytest.fixture(scope="session")
def gym_python() -> Path:
    """The released NeMo Gym's interpreter ($STAGEWISE_GYM_PYTHON, else .venv-gym/bin/python)."""
    return _side_python("NeMo Gym", ".venv-gym", "STAGEWISE_GYM_PYTHON", "GYM_STAMP", "gym_pins_key", "GYM_PINS",
                        "gym-env")


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
