"""REAL: dask_rpm.MLPClassifier against scikit-learn's own, side by side in one run.

Usage: ``python benchmarks/sklearn_estimators.py`` (about a minute on 2 cores).

Same parameters and ``random_state`` for all three, so the models are the
same (the largest relative difference of the weights is printed): scikit-learn
in this process, dask_rpm serially in this process (``client=None``, before any
cluster exists: with a default client it would train there), and
dask_rpm on a local cluster of 2 unpaced one-thread worker processes (SRPM and
uniform plans). 20,000 samples x 100 inputs, 10 classes, 5 epochs, ``tol=0`` (no
early stop). Every figure is REAL: unpaced cores, no emulation.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
from distributed import Client, LocalCluster
from sklearn.datasets import make_classification
from sklearn.neural_network import MLPClassifier as SKClassifier

import dask_rpm

CASES = [(256, 200), (1024, 2000)]  # (hidden units, batch size)


def _relative(a, b) -> float:
    pairs = zip(a.coefs_ + a.intercepts_, b.coefs_ + b.intercepts_)
    return max(float(np.max(np.abs(p - q)) / np.max(np.abs(p))) for p, q in pairs)


def _timed(est, X, y) -> tuple[float, object]:
    t0 = time.perf_counter()
    est.fit(X, y)
    return time.perf_counter() - t0, est


def main() -> None:
    warnings.simplefilter("ignore")  # ConvergenceWarning: 5 epochs on purpose
    X, y = make_classification(20000, 100, n_informative=40, n_classes=10, random_state=0)
    print(
        "| network, batch | scikit-learn | dask_rpm serial | 2 workers, srpm | 2 workers, uniform | largest weight difference |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    serial = {}
    for hidden, batch in CASES:  # before the cluster: with a client, client=None would find it
        p = dict(
            hidden_layer_sizes=(hidden,), batch_size=batch, max_iter=5, tol=0.0, random_state=0
        )
        serial[hidden] = (
            p,
            _timed(SKClassifier(**p), X, y),
            _timed(dask_rpm.MLPClassifier(**p), X, y),
        )
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            for hidden, batch in CASES:
                p, (t_sk, sk), (t_se, se) = serial[hidden]
                times, diffs = [], [_relative(sk, se)]
                for mapping in ("srpm", "uniform"):
                    on = dict(client=client, mapping=mapping, progress="none")
                    dask_rpm.MLPClassifier(**{**p, "max_iter": 1}, **on).fit(
                        X[:2000], y[:2000]
                    )  # warm
                    t, est = _timed(dask_rpm.MLPClassifier(**p, **on), X, y)
                    times.append(t)
                    diffs.append(_relative(sk, est))
                print(
                    f"| 100-{hidden}-10, {batch} | {t_sk:.2f} s | {t_se:.2f} s ({t_sk / t_se:.2f}x) | "
                    f"{times[0]:.2f} s ({t_sk / times[0]:.2f}x) | {times[1]:.2f} s ({t_sk / times[1]:.2f}x) | "
                    f"{max(diffs):.1e} |"
                )


if __name__ == "__main__":
    main()
