"""Scale-out engines: translating a stage's recipe block for Megatron-Bridge and NeMo RL, and launching them.

Both engines run as launched processes in their own environment (a container image or a venv):
megatron-bridge pins transformers < 5, Transformer Engine and mamba-ssm, so it cannot share our
CPU install. Nothing here imports them; the translations are plain dicts, the launches plain
commands. No Prefect, no MLflow.
"""

LAUNCHED_GATE = ("a gate evaluates between chunks of our engine's training; {engine!r} trains the stage in one go: "
                  "drop the gate or use engine torch")

PLACEHOLDER = "/placeholder"
"""Where the recipe check's translation pretends data and checkpoints are (none exist before the run)."""
