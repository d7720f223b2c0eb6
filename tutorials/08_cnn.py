"""Tutorial 8: a small CNN on the 8x8 digits, every stage's channels cut by the workers' rectangles.

Everything runs on this one machine: ``dask_rpm.local_cluster`` starts three
Dask workers (in this process) whose kernels run at EMULATED relative speeds
1.0, 0.5 and 0.25. We

1. load scikit-learn's 8x8 digits as images ``(samples, 1, 8, 8)``, pixels
   scaled to [0, 1] in float64, and split them into training and held-out
   digits;
2. describe a small CNN as a ``torch.nn.Sequential`` - two conv stages with
   ReLU and max-pooling, a hidden ``Linear``, the output ``Linear`` - and train
   it with ``dask_rpm.fit(network=...)``: Adam, mini-batches of 64 taken in
   order (``shuffle=False``, as a ``DataLoader`` without shuffling);
3. show the plan SRPM makes from the speeds for mini-batches of 64: a column
   of P2 and P3 that split every stage's output channels, beside P1 alone in a
   data-parallel column; which channels of each stage each worker holds, and
   the bytes of weights and Adam state it keeps (its share, not a replica);
4. score the trained network on the held-out digits (``result.score``), and
   check the ``torch`` module ``dask_rpm.nn.cnn_torch.to_torch`` builds from the
   trained parameters predicts the same labels;
5. train the same module in PyTorch from the same initial weights on the same
   batches (``torch.optim.Adam``) and compare the weights; and
   ``dask_rpm.fit_serial`` (one process, no cluster);
6. give the same network as layer records (no torch needed; dask_rpm seeds
   the weights) and train it on another plan - all three workers in one
   column, every stage's channels split three ways: ``fit_serial``'s weights
   again.

Needs scikit-learn and torch: ``pip install '.[sklearn,torch]'``.

Run::

    python tutorials/08_cnn.py

Takes 12-23 seconds on 2 cores (measured; longer on a busy machine).
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from distributed import Client

try:
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
except ImportError:
    print("SKIPPED: this tutorial needs scikit-learn and torch: pip install '.[sklearn,torch]'")
    sys.exit(0)

import dask_rpm
from dask_rpm.nn.cnn_records import conv_layers
from dask_rpm.nn.cnn_torch import params_from_torch, to_torch
from dask_rpm.planners import make_plan

SPEEDS = [1.0, 0.5, 0.25]  # EMULATED relative speeds
BATCH = 64
LEARNING_RATE = 1e-2
#: The network of step 6, as layer records: the module of :func:`network`, without torch.
RECORDS: list[Any] = [
    {"conv": 8, "kernel": 3, "padding": 1},
    "relu",
    {"maxpool": 2},
    {"conv": 16, "kernel": 3, "padding": 1},
    "relu",
    {"maxpool": 2},
    "flatten",
    {"linear": 64},
    "relu",
    {"linear": 10},
]


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Training and held-out digits as float64 images ``(samples, 1, 8, 8)`` in [0, 1]."""
    X, y = load_digits(return_X_y=True)
    images = (X / 16.0).reshape(-1, 1, 8, 8)  # load_digits' pixels are 0..16
    X_train, X_test, y_train, y_test = train_test_split(
        images, y, test_size=0.25, random_state=0, stratify=y
    )
    return X_train, X_test, y_train, y_test


def network(seed: int = 0) -> torch.nn.Sequential:
    """The CNN, its initial weights drawn by PyTorch's own default initialisation."""
    torch.manual_seed(seed)
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 8, kernel_size=3, padding=1),  # 8 x 8x8
        nn.ReLU(),
        nn.MaxPool2d(2),  # 8 x 4x4
        nn.Conv2d(8, 16, kernel_size=3, padding=1),  # 16 x 4x4
        nn.ReLU(),
        nn.MaxPool2d(2),  # 16 x 2x2
        nn.Flatten(),  # 64 features, channel-major
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 10),  # the output layer: cross-entropy applies its softmax
    ).double()  # float64, as dask_rpm trains by default


def largest_difference(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """The largest ``max |a - b| / max |b|`` over the parameters."""
    return max(float(np.abs(p - q).max() / np.abs(q).max()) for p, q in zip(a, b))


def show_plan(result: dask_rpm.FitResult) -> None:
    """Each worker's column, samples, channels of every stage, and the bytes it holds."""
    plan, layers = result.plan, result.recipe.layers
    # stats["memory"] counts each worker's buddy copies too; the shard alone is the rectangle's
    copies = result.stats["buddies"].get("memory", {})
    memory = {a: held - copies.get(a, 0) for a, held in result.stats["memory"].items()}
    print(f"plan for mini-batches of {BATCH}: {plan!r}")
    print(
        f"  the plan cuts {layers.m} rows (the narrowest stage); stage k's cut at row x is "
        f"round(x * rows_k / {layers.m}), so every worker holds channels of every stage"
    )
    heads = "".join(f"stage {k + 1}".ljust(10) for k in range(layers.depth))
    print(f"  {'worker (EMULATED speed)':<25}{'column':<8}{'samples':<14}{heads}holds")
    for c, col in enumerate(plan.columns):
        for w in col:
            r = plan.rectangle(w)
            rows = "".join(f"[{a}, {b})".ljust(10) for a, b in layers.layer_rows(r.hidden))
            samples = f"[{r.samples[0]}, {r.samples[1]})"
            print(
                f"  {f'P{w + 1} ({SPEEDS[w]})':<25}{c + 1:<8}{samples:<14}{rows}"
                f"{memory[plan.workers[w]] / 1024:.1f} KiB"
            )
    last = layers.stages[-1]
    print(
        f"  (channels of a conv stage, units of the dense one; stage {layers.depth}'s row "
        f"{last.units - 1} is the output bias channel: V[:, {last.units - 1}, 0] is the output "
        f"layer's bias)"
    )
    whole = layers.nbytes((0, layers.m), 8) * 3  # float64 weights + Adam's two moments
    per_column = [sum(memory[plan.workers[w]] for w in col) for col in plan.columns]
    print(
        f"  each column holds the whole network once ({whole / 1024:.1f} KiB of weights and "
        f"Adam state): {[round(b / 1024, 1) for b in per_column]} KiB per column"
    )
    gathered = [st.channels * st.positions for st in layers.stages[:-1]]
    print(
        f"  a column of several workers all-gathers each stage's output for the next stage: "
        f"{' + '.join(map(str, gathered))} = {sum(gathered)} values per sample and iteration "
        f"(and sums the gradients for them on the way back); the columns sum the weight updates"
    )


def train_in_pytorch(module: torch.nn.Sequential, x: np.ndarray, y: np.ndarray, epochs: int):
    """PyTorch's own training loop: the same batches in the same order, Adam on the batch mean."""
    model = copy.deepcopy(module)  # the same initial weights dask_rpm started from
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    data = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=False)
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
    return model


def accuracy(module: torch.nn.Sequential, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((module(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    X_train, X_test, y_train, y_test = digits()
    print(
        f"digits: {len(X_train)} training and {len(X_test)} held-out images of "
        f"{'x'.join(map(str, X_train.shape[1:]))} (pixels in [0, 1], float64), 10 classes"
    )
    module = network()
    options = dict(
        loss="cross-entropy",
        optimizer="adam",
        learning_rate=LEARNING_RATE,
        reduction="mean",  # the step on the batch mean, as torch's cross_entropy
        batch_size=BATCH,
        epochs=args.epochs,
        shuffle=False,  # consecutive batches in order, as a DataLoader without shuffling
    )
    with (
        dask_rpm.local_cluster(SPEEDS, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        print(cluster.emulation_label)  # results from an emulated cluster always say so
        # 2. Train the torch module on the cluster: SRPM cuts every iteration by the speeds.
        result = dask_rpm.fit(
            X_train,
            y_train,
            network=module,
            client=client,
            mapping="srpm",
            abilities=SPEEDS,
            progress=False,
            **options,
        )
        layers = result.recipe.layers  # dask_rpm.nn.cnn.ConvLayers: the network as planned
        print("the network, stage by stage (a conv or linear layer and what follows it):")
        print("\n".join(f"  {line}" for line in layers.describe()))
        # 3. Who holds which channels.
        show_plan(result)

        # 6. The same network as layer records, on one column that splits channels three ways.
        same = conv_layers(RECORDS, X_train.shape[1:], 10) == layers
        one_column = make_plan(SPEEDS, layers, len(X_train), "srpm", dp=1)
        records = dask_rpm.fit(
            X_train,
            y_train,
            network=RECORDS,
            client=client,
            mapping=one_column,
            progress=False,
            **options,
        )

    # 4. The trained network on the held-out digits: result.score (its CNNModel), and the torch
    # module to_torch builds from the trained parameters predicts the same labels.
    trained = to_torch(layers, result.params)
    with torch.no_grad():
        labels = trained(torch.from_numpy(X_test)).argmax(1).numpy()
    same = bool(np.array_equal(labels, result.predict(X_test)))
    # the mean cross-entropy over each epoch's samples (the history holds each batch's sum)
    batch_loss = result.history["error"].values.reshape(args.epochs, -1)
    per_epoch = batch_loss.sum(axis=1) / len(X_train)
    print(
        f"trained {args.epochs} epochs of {batch_loss.shape[1]} mini-batches: mean training loss "
        f"{per_epoch[0]:.3f} (epoch 1) -> {per_epoch[-1]:.4f} (epoch {args.epochs}); held-out "
        f"accuracy {result.score(X_test, y_test):.3f}"
    )
    print(f"  the torch module to_torch(layers, result.params) predicts the same labels: {same}")

    # 5. PyTorch, from the same weights on the same batches; and the serial reference.
    theirs = train_in_pytorch(module, X_train, y_train, args.epochs)
    worst = largest_difference(result.params, params_from_torch(theirs, layers))
    print(
        f"PyTorch's own loop (torch.optim.Adam, DataLoader(batch_size={BATCH}, shuffle=False)), "
        f"same initial weights: largest relative difference of the weights {worst:.1e} "
        f"(<= 1e-12: {worst <= 1e-12}); held-out accuracy {accuracy(theirs, X_test, y_test):.3f}"
    )
    serial = dask_rpm.fit_serial(X_train, y_train, network=module, **options)
    worst = largest_difference(result.params, serial.params)
    print(
        f"fit_serial (one process, no cluster): largest relative difference {worst:.1e} "
        f"(<= 1e-12: {worst <= 1e-12})"
    )

    print(f"the same network as layer records: {RECORDS}")
    print(f"  the same stages as the torch module: {same}")
    rows = "; ".join(
        f"P{w + 1} " + " ".join(f"[{a}, {b})" for a, b in layers.layer_rows(r.hidden))
        for w in one_column.columns[0]
        for r in [one_column.rectangle(w)]
    )
    print(f"  trained on {one_column!r}")
    print(f"  channels of stages 1-3: {rows}")
    serial = dask_rpm.fit_serial(X_train, y_train, network=RECORDS, **options)
    worst = largest_difference(records.params, serial.params)
    print(
        f"  equals fit_serial of the records (weights seeded by dask_rpm, seed 0): largest "
        f"relative difference {worst:.1e} (<= 1e-12: {worst <= 1e-12}); held-out accuracy "
        f"{records.score(X_test, y_test):.3f}"
    )


if __name__ == "__main__":
    main()
