"""F1 as an `evaluate` metric script, shipped in the package so `evaluate.load(<path>)` works offline.

Same name, inputs and output as the Hub's `f1` metric ({"f1": ...}); `average="macro"` is what the
training CLI reports as `f1_macro`. Computed with numpy from the confusion counts.
"""

import datasets
import evaluate
import numpy as np
from numpy.typing import ArrayLike

_DESCRIPTION = (
    "Harmonic mean of precision and recall, per class or averaged (binary, micro, macro, weighted)."
)
_KWARGS_DESCRIPTION = """
Args:
    predictions (`list[int]`): predicted class ids.
    references (`list[int]`): true class ids.
    labels (`list[int]`, optional): classes to include; defaults to every class seen in either list.
    pos_label (`int`, defaults to 1): the positive class for average="binary".
    average (`str` or None, defaults to "binary"): "binary", "micro", "macro", "weighted", or None for per-class.
Returns:
    f1 (`float`, or `list[float]` when average is None)
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class F1(evaluate.Metric):
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
        labels: ArrayLike | None = None,
        pos_label: int = 1,
        average: str = "binary",
    ) -> dict[str, float]:
        pred, ref = np.asarray(predictions), np.asarray(references)
        if average == "binary":
            labels = [pos_label]
        elif labels is None:
            labels = np.union1d(pred, ref)
        labels = np.asarray(labels)
        tp = np.array([np.sum((pred == c) & (ref == c)) for c in labels], dtype=np.float64)
        fp = np.array([np.sum((pred == c) & (ref != c)) for c in labels], dtype=np.float64)
        fn = np.array([np.sum((pred != c) & (ref == c)) for c in labels], dtype=np.float64)
        if average == "micro":
            denom = 2 * tp.sum() + fp.sum() + fn.sum()
            return {"f1": float(2 * tp.sum() / denom) if denom else 0.0}
        denom = 2 * tp + fp + fn
        per_class = np.divide(
            2 * tp, denom, out=np.zeros_like(tp), where=denom > 0
        )  # 0 where undefined, like sklearn
        if average is None:
            return {"f1": per_class.tolist()}
        if average == "weighted":
            support = tp + fn
            return {"f1": float(np.average(per_class, weights=support)) if support.sum() else 0.0}
        if average in ("macro", "binary"):
            return {"f1": float(per_class.mean())}
        raise ValueError(f"average={average!r}; expected 'binary', 'micro', 'macro', 'weighted' or None")
