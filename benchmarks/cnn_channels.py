"""REAL: convolution throughput against input x output channels (the seed's §5.1), on a CPU or a GPU.

The seed timed one ``Convolution2D`` on 62x62 feature maps with 1-4096 input and 1-4096 output
channels (10 runs each, the mean of the last 5) and found throughput falling by orders of
magnitude as the product of the two shrinks: a GPU computes a thin channel slice far below its
peak, so a planner that assumes speed proportional to area over-rates a GPU given few channels.
This script measures the same thing with torch's ``conv2d`` (forward + both backward kernels:
what a training step runs per layer), float32, 3x3 kernels, padding 1, on the device given, and
prints GFLOP/s for every (input, output) pair and against their product.

Run::

    python3 benchmarks/cnn_channels.py --device cuda --max 4096 --json out.json   # a GPU
    python3 benchmarks/cnn_channels.py --device cpu --max 256 --threads 2          # this machine

Each figure is REAL (the device's own kernels, unpaced).
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def measure(torch, c_in: int, c_out: int, device: str, batch: int, hw: int) -> float:  # noqa: ANN001
    """GFLOP/s of one training step of one conv layer (forward, input and weight gradients)."""
    x = torch.randn(batch, c_in, hw, hw, device=device, requires_grad=True)
    conv = torch.nn.Conv2d(c_in, c_out, 3, padding=1, bias=False).to(device)
    times = []
    for _ in range(10):  # the seed's protocol: 10 runs, the mean of the last 5
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = conv(x)
        y.backward(torch.ones_like(y))
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    seconds = sum(times[5:]) / 5
    flop = 3 * 2.0 * batch * c_in * c_out * 9 * hw * hw  # forward + two backward GEMMs
    return flop / seconds / 1e9


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max", type=int, default=256, help="largest channel count (a power of 2)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--hw", type=int, default=62)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.max < 1 or args.max & (args.max - 1):
        print(f"--max {args.max}: give a power of 2, e.g. 256 or 4096", file=sys.stderr)
        return 2
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device != "cpu" and not torch.cuda.is_available():
        print(f"--device {args.device}: torch sees no GPU here", file=sys.stderr)
        return 2
    sizes = [2**k for k in range(args.max.bit_length())]
    rows = []
    for c_in in sizes:
        for c_out in sizes:
            g = measure(torch, c_in, c_out, args.device, args.batch, args.hw)
            rows.append({"in": c_in, "out": c_out, "product": c_in * c_out, "gflops": g})
            print(
                f"in {c_in:5d} out {c_out:5d} product {c_in * c_out:9d}: {g:10.2f} GFLOP/s",
                flush=True,
            )
    peak = max(r["gflops"] for r in rows)
    print(
        f"\nREAL, {args.device}, {args.hw}x{args.hw} maps, batch {args.batch}: peak {peak:.1f} GFLOP/s"
    )
    by_product: dict[int, list[float]] = {}
    for r in rows:
        by_product.setdefault(r["product"], []).append(r["gflops"])
    for p in sorted(by_product):
        best = max(by_product[p])
        print(f"  product {p:9d}: best {best:10.2f} GFLOP/s ({best / peak:6.1%} of peak)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "hw": args.hw, "batch": args.batch, "rows": rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
