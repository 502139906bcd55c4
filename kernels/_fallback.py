"""The fallback for a problem nobody tuned: a Triton config only where the evidence says it wins.

Dispatch calls ``choose_fallback`` with the configs of this GPU's tuned records that are valid for
the problem. ``None`` means cuBLAS (``torch.matmul``): with no records or no model, a GPU dispatches
at cuBLAS speed from the first call instead of guessing.
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
        if ratio * (1.0 + margin) > 1.0:
            break  # ranked: nothing later is predicted faster
        distance = model.evidence(problem, config, mode)
        if distance <= max_distance:
            logger.debug("fallback for %s (%s): %s, predicted %.3fx cuBLAS time, evidence at %.2f",
                         problem, mode, config, ratio, distance)
            return config
    return None
