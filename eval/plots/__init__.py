"""The one plotting module every stage uses (matplotlib, headless).

Every chart sorts its metrics by kind first (`kinds.py`: rates in [0, 1], losses, counts,
other scores) and gives each kind its own axis, draws before -> after as paired marks
(`marks.py`), and says in its title what improved. Stage code only calls these functions.

    before_after_plot(base, final, "SFT: base vs fine-tuned")  # rates 0-1 | losses | counts
    stage_summary_plot(rows)                                   # the pipeline's closing table
    data_profile_plot(report)                                  # a data profile's dashboard
    ablation_plot(table)                                       # an ablation: every variant per metric
"""

import matplotlib

matplotlib.use("Agg")

from stagewise.eval.plots.ablation import ablation_plot  # noqa: E402
from stagewise.eval.plots.compare import before_after_plot, stage_summary_plot  # noqa: E402
from stagewise.eval.plots.curation import reject_reasons_plot  # noqa: E402
from stagewise.eval.plots.data_profile import data_profile_plot  # noqa: E402
from stagewise.eval.plots.distill import distill_plot  # noqa: E402
from stagewise.eval.plots.kinds import metric_kind  # noqa: E402
from stagewise.eval.plots.quant import quant_formats_plot  # noqa: E402
from stagewise.eval.plots.rl import pass_rate_histogram, rl_training_plot  # noqa: E402
from stagewise.eval.plots.training import cutoff_plot, loss_curves, merge_curves  # noqa: E402

__all__ = ["ablation_plot", "before_after_plot", "cutoff_plot", "data_profile_plot", "distill_plot", "loss_curves", "merge_curves", "metric_kind", "pass_rate_histogram", "quant_formats_plot", "reject_reasons_plot", "rl_training_plot",
           "stage_summary_plot"]
