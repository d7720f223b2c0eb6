"""Tutorial 6: a digit classifier with mini-batches and Adam on a local EMULATED cluster; predict, save, load.

Everything runs on this one machine: ``dask_rpm.local_cluster`` starts two
Dask workers whose kernels run at EMULATED relative speeds 1.0 and 0.5. We

1. split scikit-learn's 8x8 digits into training and held-out samples and
   standardize the pixels;
2. train ``dask_rpm.MLPClassifier`` - scikit-learn's ``MLPClassifier``,
   same parameters - on the cluster: 64 tanh hidden units, mini-batches of
   64, Adam, 10 % of the training samples held out for early stopping;
3. predict labels and probabilities for the held-out digits and score them;
4. save the model to one netCDF file, load it back (no cluster needed), and
   check the loaded model predicts exactly the same;
5. train scikit-learn's own ``MLPClassifier`` with the same parameters in
   this process: it ends with the same weights (to rounding), so the
   cluster changes how fast a model trains, not which model.

Needs scikit-learn: ``pip install '.[sklearn]'`` (the README's
``pip install '.[test]'`` has it).

Run::

    python tutorials/06_classifier.py
    python tutorials/06_classifier.py --model digits.model.nc

Takes about half a minute. ``dask-rpm predict --model digits.model.nc --data
FILE --output FILE`` applies a saved model from the command line.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from distributed import Client

try:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler
except ImportError:
    print("SKIPPED: this tutorial needs scikit-learn: pip install '.[sklearn]'")
    sys.exit(0)

import dask_rpm

SPEEDS = [1.0, 0.5]  # EMULATED relative speeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="save the model here (default: a temporary file)")
    parser.add_argument("--epochs", type=int, default=200)
    args = parser.parse_args()

    # 1. Data: 1347 training digits, 450 held out; pixels standardized on the training part.
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.25, random_state=0, stratify=y
    )
    scaler = StandardScaler().fit(X_train)
    X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
    print(
        f"digits: {len(X_train)} training and {len(X_test)} held-out samples, {X.shape[1]} pixels, "
        f"{len(np.unique(y))} classes"
    )

    options = dict(
        hidden_layer_sizes=(64,),
        activation="tanh",
        solver="adam",
        learning_rate_init=1e-3,
        batch_size=64,
        max_iter=args.epochs,
        early_stopping=True,
        validation_fraction=0.1,
        random_state=0,
    )
    with (
        dask_rpm.local_cluster(SPEEDS, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        print(cluster.emulation_label)  # results from an emulated cluster always say so
        # 2. Train on the cluster (client=None would also find this client: it is the default one).
        clf = dask_rpm.MLPClassifier(client=client, progress=False, **options)
        clf.fit(X_train, y_train)
    print(
        f"trained: {clf.n_iter_} epochs of Adam, stopped: {clf.stopped_ or 'no (all epochs done)'}"
    )
    print(
        f"validation accuracy per epoch (last 3): {[round(a, 3) for a in clf.validation_scores_[-3:]]}"
    )
    print(f"plans used: {len(clf.result_.plans)}, remaps: {len(clf.result_.remaps)} (DRPM)")

    # 3. Predict and score on the held-out digits.
    labels = clf.predict(X_test[:8])
    proba = clf.predict_proba(X_test[:8])
    print(f"first 8 held-out digits: predicted {labels.tolist()}, true {y_test[:8].tolist()}")
    print(f"probability of the predicted class: {np.round(proba.max(axis=1), 3).tolist()}")
    accuracy = clf.score(X_test, y_test)
    print(f"held-out accuracy: {accuracy:.3f}")

    # 4. Save and load: one netCDF file with weights, hyperparameters, plan history and version.
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or os.path.join(tmp, "digits.model.nc")
        clf.save(path)
        model = dask_rpm.MLPModel.load(path)
        print(f"saved and loaded: {model}")
        params = model.meta["params"]
        print(
            f"  parameters: solver {params['solver']}, batch size {params['batch_size']}, "
            f"learning rate {params['learning_rate_init']}; dask_rpm {model.meta['dask_rpm_version']}"
        )
        same = np.array_equal(model.predict(X_test), clf.predict(X_test)) and np.array_equal(
            model.predict_proba(X_test), clf.predict_proba(X_test)
        )
        print(f"loaded model predicts exactly the same: {same}")

    # 5. scikit-learn's own MLPClassifier with the same parameters: the same model.
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        theirs = MLPClassifier(**options).fit(X_train, y_train)
    diff = max(
        float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
        for a, b in zip(theirs.coefs_ + theirs.intercepts_, clf.coefs_ + clf.intercepts_)
    )
    print(
        f"scikit-learn's MLPClassifier: {theirs.n_iter_} epochs, held-out accuracy "
        f"{theirs.score(X_test, y_test):.3f}; weights differ by {diff:.1e} (relative)"
    )
    print(f"the same model as scikit-learn's (rtol 1e-9): {diff < 1e-9}")


if __name__ == "__main__":
    main()
