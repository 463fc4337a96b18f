"""`stagewise quantize` refuses bad flags with exit 2 naming the flag, before any work."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from stagewise.cli import app


@pytest.mark.parametrize("args, message", [
    (["--effective-bits", "20"], "--effective-bits: Input should be less than or equal to 16"),
    (["--formats", "nvfp4,int3"], "--formats: Input should be 'nvfp4', 'fp8' or 'bf16'"),
    (["--pin", "experts"], "--pin: expected PATTERN=FORMAT"),
    (["--pin", "*.mixer.experts=fp6"], "--pin: Input should be 'nvfp4', 'fp8' or 'bf16'"),
    (["--preset", "mega"], "--preset: Input should be 'super' or 'ultra'"),
    (["--flop-fraction", "1.5"], "--flop-fraction: Input should be less than or equal to 1"),
])
def test_bad_flags_exit_2_naming_the_flag(tiny_checkpoint, tmp_path, args, message):
    result = CliRunner().invoke(app, ["quantize", str(tiny_checkpoint), "--out", str(tmp_path / "q"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "q").exists()


def test_a_directory_that_is_no_checkpoint_is_refused(tmp_path):
    result = CliRunner().invoke(app, ["quantize", str(tmp_path), "--out", str(tmp_path / "q")])
    assert result.exit_code == 2 and str(tmp_path) in result.output
