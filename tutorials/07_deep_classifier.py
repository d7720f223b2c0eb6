"""Tutorial 7: a digit classifier with two hidden layers, every layer cut by the same rectangles.

Everything runs on this one machine: ``dask_rpm.local_cluster`` starts three
Dask workers whose kernels run at EMULATED relative speeds 1.0, 0.5 and 0.25.
We

1. split scikit-learn's 8x8 digits into training and held-out samples and
   standardize the pixels;
2. train a 64-48-32-10 network (two hidden layers) with ``dask_rpm.fit`` on
   the cluster, SRPM cutting one iteration by the workers' speeds;
3. show each worker's rectangle and its rows of *every* hidden layer, and the
   bytes of weights and Adam state each worker holds: its share, not a replica;
4. check the cluster trained the serial reference's network (``fit_serial``,
   relative 1e-10) and score both on the held-out digits;
5. train ``dask_rpm.MLPClassifier(hidden_layer_sizes=(48, 32))`` on the cluster
   next to scikit-learn's own ``MLPClassifier`` with the same parameters: the
   same weights, the same held-out accuracy.

Needs scikit-learn: ``pip install '.[sklearn]'`` (the README's
``pip install '.[test]'`` has it).

Run::

    python tutorials/07_deep_classifier.py

Takes about a minute.
"""

from __future__ import annotations

import argparse
import sys
import warnings

import numpy as np
from distributed import Client

try:
    from sklearn.datasets import load_digits
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier as SkMLPClassifier
    from sklearn.preprocessing import StandardScaler
except ImportError:
    print("SKIPPED: this tutorial needs scikit-learn: pip install '.[sklearn]'")
    sys.exit(0)

import dask_rpm
from dask_rpm.nn.layers import layers_of

SPEEDS = [1.0, 0.5, 0.25]  # EMULATED relative speeds
HIDDEN = (48, 32)


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Standardized training and held-out digits."""
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.25, random_state=0, stratify=y
    )
    scaler = StandardScaler().fit(X_train)
    return scaler.transform(X_train), scaler.transform(X_test), y_train, y_test


def show_rectangles(result: dask_rpm.FitResult) -> None:
    """Each worker's rectangle, its rows of every hidden layer and the bytes it holds."""
    plan = result.plan
    layers = layers_of(_shape(result))
    # stats["memory"] counts each worker's buddy copies too; the shard alone is the rectangle's
    copies = result.stats["buddies"].get("memory", {})
    memory = {a: held - copies.get(a, 0) for a, held in result.stats["memory"].items()}
    print(f"plan: {plan!r}")
    print(f"  network {'-'.join(map(str, layers.shape))} (with the bias input and bias units)")
    for c, col in enumerate(plan.columns):
        for w in col:
            r = plan.rectangle(w)
            rows = "  ".join(
                f"layer {k + 1} [{a}, {b})" for k, (a, b) in enumerate(layers.layer_rows(r.hidden))
            )
            print(
                f"  P{w + 1} (EMULATED speed {SPEEDS[w]}): column {c + 1}, samples "
                f"[{r.samples[0]}, {r.samples[1]}), {rows}; holds "
                f"{memory[plan.workers[w]] / 1024:.1f} KiB of weights and Adam state"
            )
    whole = layers.nbytes((0, layers.m), 8) * 3  # float64 weights + Adam's two moments
    per_column = [sum(memory[plan.workers[w]] for w in col) for col in plan.columns]
    print(
        f"  each column holds the whole network once ({whole / 1024:.1f} KiB): "
        f"{[round(b / 1024, 1) for b in per_column]} KiB; a data-parallel peer holds it on every worker"
    )


def _shape(result: dask_rpm.FitResult) -> tuple[int, ...]:
    """``(n, m_1, ..., m_L, l)`` of a result's parameters, as planned."""
    return (
        result.params[0].shape[1],
        *(p.shape[0] for p in result.params[:-1]),
        result.params[-1].shape[0],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    X_train, X_test, y_train, y_test = digits()
    print(
        f"digits: {len(X_train)} training and {len(X_test)} held-out samples, "
        f"{X_train.shape[1]} pixels; hidden layers {HIDDEN}"
    )
    options = dict(
        hidden=HIDDEN,
        activation="tanh",
        loss="cross-entropy",
        bias=True,
        optimizer="adam",
        batch_size=64,
        epochs=args.epochs,
        learning_rate=1e-3,
        shuffle=False,  # the same batches in fit and fit_serial, and easy to follow
        seed=0,
    )
    with (
        dask_rpm.local_cluster(SPEEDS, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        print(cluster.emulation_label)  # results from an emulated cluster always say so
        # 2. Train on the cluster: SRPM cuts every iteration by the speeds it is told.
        result = dask_rpm.fit(
            X_train,
            y_train,
            client=client,
            mapping="srpm",
            abilities=SPEEDS,
            progress=False,
            **options,
        )
        # 3. The rectangles, every layer's rows, and the memory each worker holds.
        show_rectangles(result)

        # 5. scikit-learn's estimator, trained on the cluster, next to scikit-learn's own.
        sk_options = dict(
            hidden_layer_sizes=HIDDEN,
            activation="tanh",
            solver="adam",
            batch_size=64,
            learning_rate_init=1e-3,
            max_iter=args.epochs,
            random_state=0,
        )
        ours = dask_rpm.MLPClassifier(client=client, progress=False, **sk_options)
        with warnings.catch_warnings():  # a fixed number of epochs, on purpose
            warnings.simplefilter("ignore", ConvergenceWarning)
            ours.fit(X_train, y_train)

    # 4. The cluster trained exactly the serial reference's network.
    serial = dask_rpm.fit_serial(X_train, y_train, **options)
    worst = max(
        float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
        for a, b in zip(result.params, serial.params)
    )
    print(
        f"fit equals fit_serial: largest relative difference {worst:.1e} (<= 1e-10: {worst <= 1e-10})"
    )
    print(
        f"held-out accuracy: cluster {result.score(X_test, y_test):.3f}, serial "
        f"{serial.score(X_test, y_test):.3f}"
    )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a fixed number of epochs, on purpose
        theirs = SkMLPClassifier(**sk_options).fit(X_train, y_train)
    same = all(np.allclose(a, b, rtol=1e-9, atol=0) for a, b in zip(ours.coefs_, theirs.coefs_))
    print(
        f"dask_rpm.MLPClassifier{HIDDEN} on the cluster: held-out accuracy "
        f"{ours.score(X_test, y_test):.3f}; scikit-learn's MLPClassifier: "
        f"{theirs.score(X_test, y_test):.3f}; the same weights (rtol 1e-9): {same}"
    )


if __name__ == "__main__":
    main()
