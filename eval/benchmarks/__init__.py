"""Local lm-eval tasks about the demo world: YAML configs here, items in data/*.jsonl.

`TASKS_DIR` is what `eval.harness` hands lm-eval as `include_path`; the same folder works
from the command line (`lm_eval --include_path eval/benchmarks --tasks world ...`) from any
directory, because the YAMLs load their items through `world_data.load`, which resolves
the file names next to itself. `build_tasks.py` regenerates the items.
"""

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent
"""The folder lm-eval indexes for the `world_*` tasks and the `world` tag."""
