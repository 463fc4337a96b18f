"""The release the translation targets and the side environment that checks it name the same versions.

engines/megatron/release.py is what the launch check refuses other releases by; dev.py's
MEGATRON_PINS is what `python3 dev.py megatron-env` installs and the megatron tests run. If they
drift, CI would validate the plans against one release while launches demand another."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from stagewise.engines.megatron.release import MEGATRON_BRIDGE_RELEASE, MEGATRON_CORE_RELEASE

DEV = Path(__file__).resolve().parents[3] / "dev.py"


def _side_env_pins() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("stagewise_dev_script", DEV)
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    return dict(pin.split("==") for group in dev.MEGATRON_PINS.values() for pin in group)


def test_the_side_environment_installs_the_release_the_launch_check_demands():
    pins = _side_env_pins()
    assert pins["megatron-bridge"] == MEGATRON_BRIDGE_RELEASE == "0.6.2"
    assert pins["megatron-core"] == MEGATRON_CORE_RELEASE == "0.19.2"
