"""A fallback for a problem nobody tuned, by the cost model: a Triton config only where the model says it wins.

Given the configs of this GPU's tuned records that are valid for the problem, ``choose_fallback`` returns the
one predicted to win with evidence near the problem, or ``None`` for cuBLAS (``torch.matmul``). It was
weighed against dispatch's rules on held-out models and did not beat them for the first pick
(docs/COSTMODEL.md), so dispatch does not call it: ``kernels/dispatch.py _untuned_choice`` decides.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ._costmodel import CostModel
from ._spec import Config, Problem, is_baseline

logger = logging.getLogger(__name__)

# A Triton config must be predicted to beat cuBLAS by this much: the side-by-side contest of the
# search asks 2% of a measured winner; a prediction gets a wider margin.
DEFAULT_MARGIN = 0.05
# ...and the same config must have been timed on a problem at most this far (log2 shape distance:
# 1 = a factor 2 in one dimension, or the same shape in the other half type; 2 = a factor 2 off in
# all of M, N and K at once, about the spacing of the corpus's token counts and layer widths).
DEFAULT_MAX_DISTANCE = 2.0


def choose_fallback(problem: Problem, mode: str, candidates: Sequence[Config], model: CostModel | None,
                    margin: float = DEFAULT_MARGIN, max_distance: float = DEFAULT_MAX_DISTANCE) -> Config | None:
    """The candidate predicted fastest, if it beats cuBLAS by ``margin`` with a nearby observation of
    itself; otherwise None (cuBLAS)."""
    if model is None or not candidates or mode not in model.modes:
        return None
    for config, ratio in model.rank(problem, [c for c in candidates if not is_baseline(c)], mode):
        if not ratio * (1.0 + margin) <= 1.0:  # a NaN prediction is no evidence of a win either
            break  # ranked: nothing later is predicted faster
        distance = model.evidence(problem, config, mode)
        if distance <= max_distance:
            logger.debug("fallback for %s (%s): %s, predicted %.3fx cuBLAS time, evidence at %.2f",
                         problem, mode, config, ratio, distance)
            return config
    return None
