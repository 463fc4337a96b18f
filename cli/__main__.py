"""`python -m stagewise.cli ...`: the same command as the `stagewise` console script.

Tests and scripts run the CLI with the current interpreter this way; it only calls main().
"""

from stagewise.cli import main

main()
