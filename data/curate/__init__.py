"""SFT data curation: structural checks, repetition filters, dedup and length limits.

    report = curate("conversations.jsonl", CurateConfig(), rejects_path="rejects.jsonl")
    report.kept            # the conversations that passed, in input order
    report.rejected        # {reason: count}; every rejected line is in rejects.jsonl

One file per check family (structural.py, repetition.py, dedup.py + minhash.py,
length.py); pipeline.py runs them in order.
"""

from stagewise.data.curate.pipeline import CHECKS, CurateReport, CurationError, curate
from stagewise.data.curate.structural import Rejected

__all__ = ["CHECKS", "CurateReport", "CurationError", "Rejected", "curate"]
