"""End-of-epoch rules: when to stop and what learning rate the next epoch uses, scikit-learn's way.

Pure (numpy only). A :class:`ConvergenceRule` is told the summed error of
every epoch (and, for early stopping, shown the weights) and decides, by the
rules of scikit-learn's ``MLPClassifier`` / ``MLPRegressor`` (stochastic
solvers):

* the epoch's loss is its summed error over the training samples (the mean
  loss plus the L2 penalty of each batch, weighted by the batch's size);
* without early stopping, an epoch "does not improve" when its loss is above
  the best so far minus ``tol``; with it, when the validation score is below
  the best so far plus ``tol`` (the weights of the best score are kept);
* more than ``n_iter_no_change`` such epochs in a row stop training, except
  that with ``solver="sgd"`` and ``learning_rate="adaptive"`` the learning
  rate is divided by 5 instead (down to 1e-6);
* ``learning_rate="invscaling"`` (sgd) sets the rate to
  ``learning_rate_init / (t + 1) ** power_t`` after each epoch, ``t`` being
  the samples trained on so far.

The serial reference (:func:`dask_rpm.fit_serial`) and the distributed engine
(:func:`dask_rpm.fit`, at block boundaries that fall on epoch ends) call the
same object with the same numbers, so both stop at the same epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = ["ConvergenceRule", "EpochDecision", "LEARNING_RATE_SCHEDULES", "epoch_error"]

#: scikit-learn's ``learning_rate`` schedules (sgd only; adam keeps its rate constant).
LEARNING_RATE_SCHEDULES = ("constant", "invscaling", "adaptive")


def epoch_error(errors: Iterable[float]) -> float:
    """An epoch's summed error, added in iteration order: the serial loop and the engine add the
    same numbers the same way, so both hand a rule identical bits."""
    total = 0.0
    for e in errors:
        total += float(e)
    return total


class EpochDecision(NamedTuple):
    """What a rule decided at the end of an epoch."""

    #: why training stops now, or None
    stop: str | None
    #: the learning rate of the next epoch
    learning_rate: float


class ConvergenceRule:
    """scikit-learn's end-of-epoch bookkeeping for one ``fit`` (module docstring).

    Parameters
    ----------
    samples : int
        Training samples per epoch (after the validation split).
    learning_rate_init : float
    solver : {"sgd", "adam"}
    learning_rate : {"constant", "invscaling", "adaptive"}
    power_t : float
    tol : float
    n_iter_no_change : int
    score : callable, optional
        ``score(params) -> float`` on the held-out samples (early stopping); the
        parameters are the augmented matrices ``W_1 .. W_L, V`` of :mod:`dask_rpm.nn.network`.
    state : dict, optional
        What :meth:`state` returned at the end of an earlier ``fit``
        (``warm_start``): the loss curve, the best loss, the count of epochs
        without improvement and the samples seen go on from there.
    verbose : bool
        Print scikit-learn's per-epoch lines (loss; validation score).
    """

    def __init__(
        self,
        samples: int,
        learning_rate_init: float,
        *,
        solver: str = "adam",
        learning_rate: str = "constant",
        power_t: float = 0.5,
        tol: float = 1e-4,
        n_iter_no_change: int = 10,
        score: Callable[[Sequence[np.ndarray]], float] | None = None,
        state: dict[str, Any] | None = None,
        verbose: bool = False,
    ) -> None:
        self.samples = int(samples)
        self.lr_init = float(learning_rate_init)
        self.lr = self.lr_init
        self.solver, self.schedule, self.power_t = solver, learning_rate, float(power_t)
        self.tol, self.n_iter_no_change = float(tol), int(n_iter_no_change)
        self.score = score
        self.verbose = bool(verbose)
        state = state or {}
        self.loss_curve: list[float] = list(state.get("loss_curve", []))
        self.best_loss: float = float(state.get("best_loss", math.inf))
        self.validation_scores: list[float] = list(state.get("validation_scores", []))
        self.best_score: float = float(state.get("best_score", -math.inf))
        self.no_improvement = int(state.get("no_improvement", 0))
        self.t = int(state.get("t", 0))
        #: epochs ended in this fit
        self.epochs = 0
        #: copies of the parameters at the best validation score (early stopping), else None
        self.best: list[np.ndarray] | None = None

    @property
    def needs_weights(self) -> bool:
        """Whether :meth:`end_epoch` needs the weights (early stopping scores them)."""
        return self.score is not None

    def end_epoch(
        self, error_sum: float, params: Sequence[np.ndarray] | None = None
    ) -> EpochDecision:
        """Book an epoch whose iterations' errors add up to ``error_sum``; stop, or the next rate."""
        loss = error_sum / self.samples
        self.loss_curve.append(loss)
        self.t += self.samples
        self.epochs += 1
        if self.verbose:  # scikit-learn's lines
            print(f"Iteration {len(self.loss_curve)}, loss = {loss:.8f}")
        if self.score is not None:
            assert params is not None, "early stopping scores the weights"
            value = float(self.score(params))
            self.validation_scores.append(value)
            if self.verbose:
                print(f"Validation score: {value:f}")
            self.no_improvement = (
                self.no_improvement + 1 if value < self.best_score + self.tol else 0
            )
            if value > self.best_score:
                self.best_score = value
                self.best = [p.copy() for p in params]
        else:
            self.no_improvement = self.no_improvement + 1 if loss > self.best_loss - self.tol else 0
            self.best_loss = min(self.best_loss, loss)
        if self.solver == "sgd" and self.schedule == "invscaling":
            self.lr = self.lr_init / (self.t + 1) ** self.power_t
        if self.no_improvement <= self.n_iter_no_change:
            return EpochDecision(None, self.lr)
        what = "Validation score" if self.score is not None else "Training loss"
        msg = (
            f"{what} did not improve more than tol={self.tol:f} for "
            f"{self.n_iter_no_change} consecutive epochs."
        )
        adaptive = self.solver == "sgd" and self.schedule == "adaptive"
        if adaptive and self.lr > 1e-6:
            self.lr /= 5.0
            self.no_improvement = 0
            self._say(f"{msg} Setting learning rate to {self.lr:f}")
            return EpochDecision(None, self.lr)
        self._say(f"{msg} Learning rate too small. Stopping." if adaptive else f"{msg} Stopping.")
        return EpochDecision(msg, self.lr)

    def _say(self, line: str) -> None:
        """One of scikit-learn's lines on stdout, with ``verbose``."""
        if self.verbose:
            print(line)

    def state(self) -> dict[str, Any]:
        """The bookkeeping a warm-started ``fit`` continues from."""
        return {
            "loss_curve": list(self.loss_curve),
            "best_loss": self.best_loss,
            "validation_scores": list(self.validation_scores),
            "best_score": self.best_score,
            "no_improvement": self.no_improvement,
            "t": self.t,
        }
