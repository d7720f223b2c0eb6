"""The estimators' error for data they cannot train on (its own module: :mod:`._base` and
:mod:`.dask_data` both raise it)."""

from __future__ import annotations

__all__ = ["EstimatorError"]


class EstimatorError(ValueError):
    """Data the estimator cannot train on, or a fitted network it cannot go on with; the message
    says what is valid. (A bad hyperparameter is scikit-learn's ``InvalidParameterError``.)"""
