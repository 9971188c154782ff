"""Fashion-MNIST linear probe of every shipped 28×28×1 backbone, in both BatchNorm modes.

A full-data, non-private linear probe: features of the 60,000 training images once, then a multinomial
logistic regression (full-batch L-BFGS in torch, float32) on standardised features (each feature centred and
scaled by its training mean/std — an invertible affine map, so the same linear-model family; it only
conditions the optimiser), evaluated on the 10,000 test images. Features are computed in chunks of
``--bn-batch`` images with :func:`capc_common.models.extract_features`, exactly as teachers do.

Compared: every shipped backbone for 28×28×1 (``current`` and ``running`` statistics), for each learned
hybrid also its learned part alone (``<name>/learned``), a random-init backbone of the default's
architecture (``random_init``, and ``random_init/learned``), the scattering front end (``scatter-28x28x1``)
and raw pixels. The random-init backbone keeps its initial running statistics (mean 0, variance 1).

    python benchmarks/linear_probe.py                 # table; CSV + PNG in benchmarks/results/
    python benchmarks/linear_probe.py --format json   # one JSON object:
    # {"<backbone>": {"current": acc, "running": acc}, "random_init": {...}, "raw_pixels": acc}
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from capc_common.data import load_dataset
from capc_common.models import (
    Backbone,
    build_backbone,
    default_backbone,
    extract_features,
    list_backbones,
    load_backbone,
)

RESULTS = Path(__file__).resolve().parent / "results"
SHAPE = (28, 28, 1)
MODES = ("current", "running")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Probe:
    """Multinomial logistic regression on standardised features, fitted by full-batch L-BFGS.

    The problem is convex, so the starting point only changes how fast L-BFGS converges: each fit starts
    from the previous solution with at least as many features (first rows), e.g. the running-mode fit from
    the current-mode one, and the scattering backbone from the hybrid (whose features start with the same
    scattering coefficients).
    """

    def __init__(self, *, l2: float, max_iter: int, tolerance: float) -> None:
        self.l2, self.max_iter, self.tolerance = l2, max_iter, tolerance
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None

    def fit(
        self,
        train: npt.NDArray[np.float32],
        train_y: npt.NDArray[np.int64],
        test: npt.NDArray[np.float32],
        test_y: npt.NDArray[np.int64],
    ) -> float:
        """Test accuracy after fitting on ``train``.

        The gradient is written out (``Gᵀ X`` with ``G = (softmax − onehot)/n``) rather than left to
        autograd: autograd's ``Xᵀ G`` for a tall ``X`` measured 13–20 s per step here against 0.4 s.
        """
        x = torch.from_numpy(train)
        mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
        x = (x - mean) / std
        x_test = (torch.from_numpy(test) - mean) / std
        classes = int(train_y.max()) + 1
        onehot = F.one_hot(torch.from_numpy(np.array(train_y)), classes).float()
        weight = torch.zeros(x.shape[1], classes)
        bias = torch.zeros(classes)
        if self._last is not None and self._last[0].shape[0] >= x.shape[1]:
            weight.copy_(self._last[0][: x.shape[1]])
            bias.copy_(self._last[1])
        opt = torch.optim.LBFGS(
            [weight, bias],
            lr=1.0,
            max_iter=self.max_iter,
            history_size=10,
            tolerance_grad=self.tolerance,
            tolerance_change=1e-12,
            line_search_fn="strong_wolfe",
        )
        l2, n = self.l2, len(x)

        def closure() -> torch.Tensor:
            log_p = torch.log_softmax(x @ weight + bias, dim=1)
            loss = -(onehot * log_p).sum() / n + 0.5 * l2 * (weight * weight).sum()
            residual = (log_p.exp() - onehot) / n
            weight.grad = (residual.T @ x).T.contiguous() + l2 * weight
            bias.grad = residual.sum(0)
            return loss

        opt.step(closure)
        self._last = (weight.clone(), bias.clone())
        predictions = (x_test @ weight + bias).argmax(1).numpy()
        return float((predictions == test_y).mean())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", choices=["text", "json"], default="text")
    parser.add_argument("--bn-batch", type=int, default=256, help="BatchNorm chunk size (query batch size).")
    parser.add_argument("--l2", type=float, default=1e-4, help="L2 penalty of the probe (on the mean loss).")
    parser.add_argument("--max-iter", type=int, default=150, help="L-BFGS iterations per fit.")
    parser.add_argument(
        "--tolerance", type=float, default=1e-6, help="Stop when every gradient entry is below."
    )
    parser.add_argument("--limit", type=int, default=None, help="Use only the first N train/test images.")
    parser.add_argument("--threads", type=int, default=None, help="Torch CPU threads.")
    parser.add_argument("--backbones", nargs="*", default=None, help="Shipped names (default: all 28x28x1).")
    parser.add_argument("--out", type=Path, default=RESULTS, help="Directory for linear_probe.csv/.png.")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    train, test = load_dataset("fashion-mnist", split="train"), load_dataset("fashion-mnist", split="test")
    if args.limit:
        train, test = train.subset(np.arange(args.limit)), test.subset(np.arange(min(args.limit, len(test))))
    names = args.backbones or [n for n in list_backbones() if load_backbone(n).input_shape == SHAPE]
    # Learned backbones first: their solutions warm-start the scattering probe (see Probe).
    names.sort(key=lambda n: load_backbone(n).learned_dim == 0)
    probe = Probe(l2=args.l2, max_iter=args.max_iter, tolerance=args.tolerance)
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {}

    def record(
        label: str, mode: str, train_x: npt.NDArray[np.float32], test_x: npt.NDArray[np.float32]
    ) -> float:
        started = time.monotonic()
        acc = probe.fit(train_x, train.labels, test_x, test.labels)
        seconds = time.monotonic() - started
        rows.append(
            {
                "model": label,
                "mode": mode,
                "accuracy": acc,
                "feature_dim": train_x.shape[1],
                "fit_s": round(seconds, 1),
            }
        )
        log(f"{label:32s} {mode:8s} acc {acc:.4f}  dim {train_x.shape[1]:6d}  fit {seconds:5.0f}s")
        return acc

    def evaluate(label: str, backbone: Backbone) -> None:
        result[label] = {}
        learned: dict[str, float] = {}
        for mode in MODES:
            started = time.monotonic()
            feats = [
                extract_features(backbone, d.images, bn_batch=args.bn_batch, mode=mode) for d in (train, test)
            ]
            log(f"{label:32s} {mode:8s} features {time.monotonic() - started:5.0f}s")
            result[label][mode] = record(label, mode, *feats)
            if 0 < backbone.learned_dim < backbone.feature_dim:
                cut = backbone.feature_dim - backbone.learned_dim
                learned[mode] = record(f"{label}/learned", mode, *(f[:, cut:] for f in feats))
        if learned:
            result[f"{label}/learned"] = learned

    for name in names:
        evaluate(name, load_backbone(name))
    default = load_backbone(default_backbone(*SHAPE))
    evaluate(
        "random_init", build_backbone(default.arch, input_shape=SHAPE, config=default.config, seed=0).eval()
    )
    pixels = [d.images.reshape(len(d), -1).astype(np.float32) / 255.0 for d in (train, test)]
    result["raw_pixels"] = record("raw_pixels", "-", *pixels)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "linear_probe.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _plot(rows, args.out / "linear_probe.png", bn_batch=args.bn_batch)
    if args.format == "json":
        print(json.dumps(result))
    else:
        for row in rows:
            print(f"{row['model']:34s} {row['mode']:8s} {row['accuracy']:.4f}  (dim {row['feature_dim']})")
    return result


def _plot(rows: list[dict[str, Any]], path: Path, *, bn_batch: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['model']}\n{r['mode']}" if r["mode"] != "-" else r["model"] for r in rows]
    accs = [100 * r["accuracy"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4))
    colours = {"current": "C0", "running": "C1"}
    bars = ax.bar(range(len(rows)), accs, color=[colours.get(r["mode"], "C7") for r in rows])
    for bar, acc in zip(bars, accs, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, acc + 0.3, f"{acc:.1f}", ha="center", fontsize=8)
    ax.set_xticks(range(len(rows)), labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylim(min(accs) - 5, 100)
    ax.set_ylabel("Fashion-MNIST test accuracy (%)")
    ax.set_title(f"Linear probe (full data, non-private), BN chunks of {bn_batch}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
