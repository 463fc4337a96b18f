"""stagewise: the Nemotron 3 training recipe as one Prefect pipeline that logs to MLflow.

This is the one import root. Its rooms live at the top of the repository, each a folder named
for its concern, and are linked in here (`stagewise/flows -> ../flows`, ...), so a checkout, an
editor, a type checker and an installed wheel all see the same `stagewise.<room>` names and
nothing else is importable from the install:

    cli/          the `stagewise` command (one module per command group)
    recipe/       the recipe: schema, YAML source, loader, checks, every stage's block, the doctor
    flows/        Prefect flows: the stage contract, the registry, one flow per stage, the pipeline,
                  the deployed flows, promotion, the nightly evaluation, ablation
    tasks/        Prefect tasks: thin units that call the libraries and log to MLflow
    store/        what runs keep: content-addressed step directories, the MLflow door, references
    engines/      external training engines (`engine:` in a stage block): Megatron-Bridge, NeMo RL,
                  and how a launch runs (torchrun, Slurm, Kubernetes)
    deployments/  the Prefect deployments `stagewise serve` registers
    model/ data/ eval/ quant/   the libraries: no Prefect, no MLflow
    recipes/      the shipped recipes (package data: `stagewise run tiny` finds them by name)

Importing it sets the Prefect defaults this project needs on small machines before Prefect is
imported anywhere (measured in docs/STACK.md, Prefect): the ephemeral API server can take
12-22 s to start on 2 cores, close to Prefect's 20 s default timeout, and its analytics cause
"database is locked" noise. The libraries' own loggers (e.g. the engine's warning that a resume
runs under other numerics) are routed into the Prefect run logs. A user's own environment
variables always win.
"""

import os

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_UI_ENABLED", "false" if os.environ.get("CI") else "true")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "stagewise.model,stagewise.data,stagewise.eval")
