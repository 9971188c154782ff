"""The secure-aggregation DP-SGD recipe, one step at a time, with the privacy noise on and off.

Each variant trains the engine's head with :class:`~capc_common.mechanisms.training.DPSGDTrainer` (the code
the federation runs) on the pooled records of a validation split of the training images, full batch: the
sum over parties of a full-batch round is the pooled sum, so one party gives the federation's head up to the
noise draw. ``noise off`` releases the noiseless sums (what the recipe alone is worth); ``noise on`` adds
the discrete Gaussian calibrated so that all the variant's releases cost ``ε`` (δ = 1e-5):

* ``old`` — the recipe before: raw coordinates, heavy ball (lr 8, momentum 0.9), 100 rounds, a public
  normaliser;
* ``adam`` — the student steps with Adam (lr 0.1) instead, 100 rounds;
* ``adam+basis`` — the head over the top 1,024 principal directions of the backbone's features on synthetic
  images (public), Adam lr 0.3, 60 rounds;
* ``adam+statistics`` — plus the statistics release (one more release) and the standardisation it pays for;
* ``recipe`` — the default of ``secagg-dpsgd`` (:data:`~capc_common.federation.sizing.DPSGD_RECIPE`): unit
  variance per coordinate, every gradient clipped (clip 0.1), heavy ball at the step that follows the noise
  (docs/mechanisms.md, "A step that follows the noise"); noise off, the step is its cap;
* ``recipe+14-bits`` — the recipe with the encoding it had until 2026-12-02 (14 fractional bits: at ε 1
  every record clipped to ``C_eff = 0.94·C`` while the noise is calibrated to ``C``; now 16 bits, 0.98·C);
* ``recipe+fine-encoding`` — the recipe with 20 fractional bits, ``C_eff ≈ C``, its noise of the same ``z``
  drawn as a rounded continuous Gaussian (no table reaches that σ): a measurement of what the encoding
  costs, never a private release (docs/mechanisms.md, "Where ε = 1 stopped").

    python benchmarks/dpsgd_recipe.py --format json                  # 50,000 / 10,000 validation split
    python benchmarks/dpsgd_recipe.py --smoke --format json          # digits, seconds

JSON keys: ``setting`` (dataset, records, evaluation, δ), ``rows[]`` (``variant``, ``noise``, ``epsilon``,
``seed``, ``accuracy``, ``releases``, ``seconds``) and ``table[]`` (``variant``, ``noise``, ``epsilon``,
``accuracy_mean``, ``accuracy_std``, ``seeds``); CSV and Markdown next to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from methods.common import DELTA, ORDERS, log
from methods.dpsgd import public_basis_for

from capc_common.aggregation import mechanism_noise
from capc_common.federation.sizing import DPSGD_RECIPE, DPSGD_ROUNDS
from capc_common.mechanisms import SecureDPSGD, calibrate
from capc_common.mechanisms.central import PartyData, predict_head, release_once
from capc_common.mechanisms.dpsgd import FixedPoint
from capc_common.mechanisms.training import DPSGDTrainer, Recipe
from capc_common.privacy import SystemNoise
from capc_common.privacy.analysis import epsilon_from_rdp, rdp_subsampled_discrete_gaussian
from capc_common.privacy.noise.tables import MAX_SIGMA

ROOT = Path(__file__).resolve().parents[1]
#: variant → (uses the basis, recipe fields); ``expected_batch`` is filled with the record count.
VARIANTS: dict[str, tuple[bool, dict[str, Any]]] = {
    "old": (False, {"rounds": 100, "statistics": False, "optimizer": "momentum", "learning_rate": 8.0}),
    "adam": (False, {"rounds": 100, "statistics": False, "optimizer": "adam", "learning_rate": 0.1}),
    "adam+basis": (True, {"rounds": 60, "statistics": False, "optimizer": "adam", "learning_rate": 0.3}),
    "adam+statistics": (True, {"rounds": 60, "statistics": True, "optimizer": "adam", "learning_rate": 0.3}),
    "recipe": (True, {"rounds": DPSGD_ROUNDS, "statistics": True, **DPSGD_RECIPE}),
    "recipe+14-bits": (True, {"rounds": DPSGD_ROUNDS, "statistics": True, **DPSGD_RECIPE, "bits": 14}),
    "recipe+fine-encoding": (True, {"rounds": DPSGD_ROUNDS, "statistics": True, **DPSGD_RECIPE, "bits": 20}),
}


def train(
    party: PartyData, basis: np.ndarray | None, fields: dict[str, Any], *, epsilon: float, noise: bool
) -> tuple[DPSGDTrainer, float]:
    """One variant's head, with or without the noise its releases would carry at ``epsilon``."""
    fields = dict(fields)
    clip = fields.pop("clip", 1.0)
    bits = fields.pop("bits", None)
    if not noise:
        fields.pop("step_noise", None)  # no noise to follow: the step is its cap
    recipe = Recipe(**fields, expected_batch=float(len(party.labels)))

    def eps_of(z: float) -> float:
        rdp = rdp_subsampled_discrete_gaussian(ORDERS, sampling_rate=1.0, noise_multiplier=z)
        return float(epsilon_from_rdp(ORDERS, recipe.releases * rdp, delta=DELTA)[0])

    z = calibrate(eps_of, target=epsilon)
    dim = party.features.shape[1] if basis is None else basis.shape[1]
    fixed_point = None if bits is None else FixedPoint(bits)
    m = SecureDPSGD(
        classes=10, dim=dim, clip=clip, noise_multiplier=z, sampling_rate=1.0, fixed_point=fixed_point
    )
    trainer = DPSGDTrainer(m, recipe, basis=basis)
    x, parts, sampler = trainer.prepare(party.features), mechanism_noise(), SystemNoise()
    # A σ beyond the table sampler (a fine encoding at a large z) is drawn in floating point: a utility
    # measurement only, never a release.
    simulated = np.random.default_rng(secrets.randbits(128)) if m.sigma > MAX_SIGMA else None
    for _ in range(trainer.rounds):
        contribution = trainer.contribute(trainer.state(), x, party.labels, sampler)
        if not noise:
            trainer.absorb(contribution)
        elif simulated is not None:
            trainer.absorb(
                contribution + np.rint(simulated.normal(0.0, m.sigma, contribution.shape)).astype(np.int64)
            )
        else:
            trainer.absorb(release_once(m, [contribution], noise=parts))
    return trainer, eps_of(z)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 3.0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--train-limit", type=int, default=60_000)
    parser.add_argument("--validation", type=int, default=10_000)
    parser.add_argument("--smoke", action="store_true", help="digits (raw pixels), one seed: seconds")
    parser.add_argument("--cache-dir", type=Path, default=ROOT / "runs" / "cache")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "dpsgd_recipe")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    from methods.data import load_features

    args.dataset = "digits" if args.smoke else "fashion-mnist"
    args.evaluate_on, args.test_limit = "validation", None
    if args.smoke:
        args.train_limit, args.validation, args.seeds = 1437, 400, args.seeds[:1]
    start = time.perf_counter()
    tx, ty, _, vx, vy = load_features(args)
    basis = public_basis_for(args)["basis"]
    party = PartyData("pooled", tx, ty)
    rows = []
    for variant in args.variants:
        uses_basis, fields = VARIANTS[variant]
        for epsilon in args.epsilons:
            for noise in (False, True):
                if not noise and epsilon != args.epsilons[0]:  # noise off: deterministic, any ε the same
                    first = next(r for r in rows if r["variant"] == variant and r["noise"] == "off")
                    rows.append({**first, "epsilon": epsilon})
                    continue
                for seed in args.seeds if noise else args.seeds[:1]:
                    t = time.perf_counter()
                    trainer, spent = train(
                        party, basis if uses_basis else None, fields, epsilon=epsilon, noise=noise
                    )
                    acc = float(np.mean(predict_head(trainer.head(), vx) == vy))
                    rows.append({"variant": variant, "noise": "on" if noise else "off", "epsilon": epsilon,
                                 "spent": spent, "seed": seed, "accuracy": acc, "releases": trainer.rounds,
                                 "seconds": round(time.perf_counter() - t, 2)})  # fmt: skip
                    log(f"{variant:11} ε {epsilon:g} noise {rows[-1]['noise']:3} seed {seed}: {acc:.4f}")
    table = []
    for key in dict.fromkeys((r["variant"], r["noise"], r["epsilon"]) for r in rows):
        accs = [r["accuracy"] for r in rows if (r["variant"], r["noise"], r["epsilon"]) == key]
        mean, std = float(np.mean(accs)), float(np.std(accs))
        table.append({"variant": key[0], "noise": key[1], "epsilon": key[2], "seeds": len(accs),
                      "accuracy_mean": mean, "accuracy_std": std})  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.with_suffix(".csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"Validation accuracy (%), {args.dataset}, {len(ty)} records / {len(vy)} held out, full batch, "
        f"δ = {DELTA:g}; mean ± std over seeds (noise off: deterministic, one run).",
        "",
        "| variant | noise | " + " | ".join(f"ε = {e:g}" for e in args.epsilons) + " |",
        "|---|---|" + "---|" * len(args.epsilons),
    ]
    for variant in args.variants:
        for noise in ("off", "on"):
            cells = [
                f"{100 * t['accuracy_mean']:.1f} ± {100 * t['accuracy_std']:.1f}"
                for e in args.epsilons
                for t in table
                if (t["variant"], t["noise"], t["epsilon"]) == (variant, noise, e)
            ]
            lines.append(f"| {variant} | {noise} | " + " | ".join(cells) + " |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    result = {
        "setting": {"dataset": args.dataset, "records": len(ty), "evaluation": len(vy), "delta": DELTA},
        "rows": rows,
        "table": table,
        "seconds": round(time.perf_counter() - start, 1),
        "outputs": [str(args.out.with_suffix(s)) for s in (".csv", ".md")],
    }
    print(json.dumps(result) if args.format == "json" else "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
