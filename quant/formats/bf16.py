"""BF16: not quantized. Always a choice of the search, what `keep_bf16` keeps, and the baseline
the FLOP budget and the effective bits are measured against (16 bits, cost 1 per FLOP).

No modelopt preset, no scales: its weights are written in the export's own dtype and read back as they are.
"""

from __future__ import annotations

from stagewise.quant.formats.spec import QuantFormat

BF16 = QuantFormat(name="bf16", bits=16.0, flop_cost=1.0, colour="#999999")
