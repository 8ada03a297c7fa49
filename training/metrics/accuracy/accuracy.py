"""Accuracy as an `evaluate` metric script, shipped in the package so `evaluate.load(<path>)` works offline.

Same name, inputs and output as the Hub's `accuracy` metric: {"accuracy": fraction of predictions == references}.
"""

import datasets
import evaluate
import numpy as np
from numpy.typing import ArrayLike

_DESCRIPTION = "Fraction of predictions equal to the references (optionally weighted by sample_weight)."
_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[int]`): predicted class ids.
    references (`list[int]`): true class ids.
    normalize (`bool`, defaults to True): fraction if True, count of correct predictions if False.
    sample_weight (`list[float]`, optional): per-example weights.
Returns:
    accuracy (`float`)
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(
        self,
        predictions: ArrayLike,
        references: ArrayLike,
        normalize: bool = True,
        sample_weight: ArrayLike | None = None,
    ) -> dict[str, float]:
        correct = (np.asarray(predictions) == np.asarray(references)).astype(np.float64)
        if sample_weight is not None:
            correct = correct * np.asarray(sample_weight, dtype=np.float64)
            total = float(np.sum(sample_weight))
        else:
            total = float(correct.size)
        score = float(correct.sum())
        return {"accuracy": score / total if normalize else score}
