"""External training engines, named after a stage block's `engine:` key: Megatron-Bridge
(megatron/) and NeMo RL (nemo_rl/), and how a launch runs (launch/: torchrun, Slurm, Kubernetes).

Each engine has its translation (our block as its config and overrides), the data we write for
it, the stage glue that launches it and adopts what it exports, and its part of the recipe check
(engines/checks.py), together. Both run as launched processes in their own environment (a
container image or a venv): megatron-bridge pins transformers < 5, Transformer Engine and
mamba-ssm, so it cannot share our CPU install. Nothing here imports them; the translations are
plain dicts, the launches plain commands. Prefect appears only in launch/task.py (a launch is
one task) and the stage glue that calls it.

The names below are shared by the engines' recipe checks.
"""

LAUNCHED_GATE = ("a gate evaluates between chunks of our engine's training; {engine!r} trains the stage in one go: "
                  "drop the gate or use engine torch")
LAUNCHED_SUBSTAGE_GATE = ("a gate that evaluates between chunks (eval_every_tokens below the sub-stage's tokens) needs our "
                          "engine's training; {engine!r} trains the sub-stage in one go: evaluate at its end "
                          "(eval_every_tokens >= tokens), drop the gate or use engine torch")

PLACEHOLDER = "/placeholder"
"""Where the recipe check's translation pretends data and checkpoints are (none exist before the run)."""
