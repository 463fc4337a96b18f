"""Prefect tasks: thin units that call the libraries and log to MLflow.

Importing this package sets Prefect defaults that this project needs on small machines
(measured in docs/STACK.md, Prefect): the ephemeral API server can take 12-22 s to start on
2 cores, close to Prefect's 20 s default timeout, and its analytics cause "database is
locked" noise. The libraries' own loggers (model, data, eval: e.g. the engine's warning that a
resume runs under other numerics) are routed into the Prefect run logs. A user's own
environment variables always win.
"""

import os

os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_UI_ENABLED", "false" if os.environ.get("CI") else "true")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "model,data,eval")
