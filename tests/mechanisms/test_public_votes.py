"""DPPL-Public as a release (:class:`PublicPrototypeVotes`): one record moves one count by one, the accounting
is the discrete Gaussian's zCDP, the central runner releases through real sharing and selects top-K, and bad
input is refused with a message."""

from __future__ import annotations

import numpy as np
import pytest

from capc_common.aggregation import mechanism_noise
from capc_common.errors import InputError
from capc_common.mechanisms import DPPrototypes, PublicPrototypeVotes
from capc_common.mechanisms.central import PartyData, run_public_prototype_votes
from capc_common.privacy import SeededNoise
from capc_common.privacy.analysis import epsilon_from_zcdp

pytestmark = pytest.mark.filterwarnings("ignore::capc_common.privacy.InsecureNoiseWarning")


def _data(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Four classes around one-hot centres and a pool: one candidate near each centre among 40 others."""
    centres = np.eye(4, 16) * 3.0
    near = centres + 0.3 * rng.standard_normal(centres.shape)
    far = rng.standard_normal((40, 16))
    pool = np.concatenate([far[:20], near, far[20:]])
    x = np.repeat(centres, 200, axis=0) + 0.8 * rng.standard_normal((800, 16))
    return centres, pool, x, np.repeat(np.arange(4), 200)


def test_accounting_known_answers() -> None:
    rng = np.random.default_rng(0)
    _, pool, _, _ = _data(rng)
    m = PublicPrototypeVotes(classes=4, candidates=pool, rho=0.5, per_class=3)
    assert m.sigma == pytest.approx(1.0)  # σ = 1/√(2ρ)
    assert m.zcdp == pytest.approx(0.5)
    np.testing.assert_allclose(m.release_rdp([2.0, 8.0]), [1.0, 4.0])  # ρλ
    # per_class is post-processing of the one release: it costs nothing.
    one = PublicPrototypeVotes(classes=4, candidates=pool, rho=0.5, per_class=1)
    np.testing.assert_array_equal(one.release_rdp([2.0, 8.0]), m.release_rdp([2.0, 8.0]))
    # The same ρ as DP prototypes gives the same ε (one Gaussian release of a sensitivity-1 histogram).
    assert epsilon_from_zcdp(m.zcdp, delta=1e-5)[0] == pytest.approx(
        epsilon_from_zcdp(DPPrototypes(classes=4, dim=16, rho=0.5).zcdp, delta=1e-5)[0], rel=1e-3
    )
    assert m.sigmas().shape == (4 * len(pool),) and np.all(m.sigmas() == m.sigma)
    assert m.params()["neighbouring"] == "add/remove"
    # Known answers away from ρ = 1/2 (where 2ρ = 1 hides a σ = 1/(2ρ) slip).
    for rho, sigma in ((2.0, 0.5), (0.125, 2.0)):
        other = PublicPrototypeVotes(classes=4, candidates=pool, rho=rho)
        assert other.sigma == pytest.approx(sigma) and other.zcdp == pytest.approx(rho)
        np.testing.assert_allclose(other.release_rdp([3.0]), [3.0 * rho])
    # The ring bound: one count can hold every record.
    assert m.max_abs_total(records=1234) == 1234.0


@pytest.mark.parametrize("edit", ["add", "remove", "move"])
def test_one_record_moves_one_count_by_one(edit: str) -> None:
    """The sensitivity the accounting rests on, on real contributions: adding or removing a record changes
    exactly one count by one; moving a record's features changes at most its own vote."""
    rng = np.random.default_rng(1)
    _, pool, x, y = _data(rng)
    m = PublicPrototypeVotes(classes=4, candidates=pool, rho=1.0)
    base = m.contribution(x, y)
    assert base.sum() == len(y) and base.dtype == np.int64
    for i in rng.choice(len(y), size=25, replace=False):
        if edit == "add":
            other = m.contribution(np.vstack([x, x[i] + 0.5]), np.append(y, y[i]))
            diff = other - base
            assert diff.sum() == 1 and np.abs(diff).sum() == 1
        elif edit == "remove":
            diff = m.contribution(np.delete(x, i, axis=0), np.delete(y, i)) - base
            assert diff.sum() == -1 and np.abs(diff).sum() == 1
        else:
            moved = x.copy()
            moved[i] = rng.standard_normal(16) * 5
            diff = m.contribution(moved, y) - base
            assert np.abs(diff).sum() in (0, 2)  # its vote leaves one candidate for another, nothing else
            assert np.all(diff.reshape(4, -1)[np.arange(4) != y[i]] == 0)


def test_votes_are_the_nearest_candidate_by_cosine_ties_to_the_lowest_index() -> None:
    pool = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])  # rows 0 and 1 are the same direction
    m = PublicPrototypeVotes(classes=2, candidates=pool, rho=1.0)
    np.testing.assert_array_equal(m.votes(np.array([[3.0, 0.1], [0.1, 3.0], [1.0, 1.0]])), [0, 2, 0])
    counts = m.contribution(np.array([[3.0, 0.1], [0.1, 3.0]]), np.array([1, 1]))
    np.testing.assert_array_equal(counts, [0, 0, 0, 1, 0, 1])


def test_central_runner_releases_selects_top_k_and_the_student_learns() -> None:
    rng = np.random.default_rng(3)
    centres, pool, x, y = _data(rng)
    order = rng.permutation(len(y))
    parties = [PartyData(f"p{i}", x[part], y[part]) for i, part in enumerate(np.array_split(order, 3))]
    m = PublicPrototypeVotes(classes=4, candidates=pool, rho=2.0, per_class=2)
    total = run_public_prototype_votes(parties, mechanism=m, noise=mechanism_noise(seed="central"))
    # The same release by hand: the summed counts plus the guardian's and the student's parts of the noise,
    # each from its own stream in canonical order.
    parts = m.noise_part(SeededNoise("central")) + m.noise_part(SeededNoise("central\0student"))
    np.testing.assert_array_equal(total, m.contribution(x, y) + parts)
    chosen = m.select(total)
    assert chosen.shape == (4, 2) and all(len(set(row)) == 2 for row in chosen.tolist())
    assert all(chosen[c, 0] == 20 + c for c in range(4))  # each class's near candidate gets its votes
    test_x = np.repeat(centres, 50, axis=0) + 0.8 * rng.standard_normal((200, 16))
    test_y = np.repeat(np.arange(4), 50)
    assert (m.predict(test_x, total) == test_y).mean() > 0.95
    # Noise far above the counts: the selection no longer finds the near candidates.
    blind = PublicPrototypeVotes(classes=4, candidates=pool, rho=1e-8)
    picks = blind.select(
        run_public_prototype_votes(parties, mechanism=blind, noise=mechanism_noise(seed="blind"))
    )
    assert sum(20 + c == picks[c, 0] for c in range(4)) <= 1


def test_prototypes_weigh_the_selected_candidates_by_their_clipped_noisy_counts() -> None:
    pool = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    m = PublicPrototypeVotes(classes=2, candidates=pool, rho=1.0, per_class=2)
    # class 0: counts 3, 1, 0 -> top 2 are candidates 0 and 1, weights 3 and 1
    # class 1: counts -4, -1, -2 -> top 2 are 1 and 2, both clipped to 0: their plain mean
    total = np.array([3, 1, 0, -4, -1, -2])
    proto = m.prototypes(total)
    unit = pool / np.linalg.norm(pool, axis=1, keepdims=True)
    np.testing.assert_allclose(proto[0], (3 * unit[0] + 1 * unit[1]) / 4)
    np.testing.assert_allclose(proto[1], (unit[1] + unit[2]) / 2)
    np.testing.assert_array_equal(m.predict(np.array([[5.0, 0.1], [0.0, 3.0]]), total), [0, 1])


def test_select_is_stable_top_k() -> None:
    m = PublicPrototypeVotes(classes=2, candidates=np.eye(4), rho=1.0, per_class=2)
    np.testing.assert_array_equal(m.select(np.array([1, 5, 5, 0, -2, 0, 0, 3])), [[1, 2], [3, 1]])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"candidates": np.zeros((0, 4))}, "non-empty"),
        ({"candidates": np.vstack([np.eye(4), [0.0, np.nan, 0.0, 0.0]])}, "candidate pool.*inf or NaN"),
        ({"per_class": 5}, "per_class"),
        ({"rho": 0.0}, "rho"),
        ({"classes": 1}, "classes"),
    ],
)
def test_bad_parameters_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(InputError, match=match):
        PublicPrototypeVotes(**{"classes": 2, "candidates": np.eye(4), "rho": 1.0, **kwargs})


def test_bad_inputs_are_refused() -> None:
    m = PublicPrototypeVotes(classes=2, candidates=np.eye(4), rho=1.0)
    with pytest.raises(InputError, match="do not match"):
        m.contribution(np.ones((3, 5)), np.zeros(3, dtype=np.int64))
    with pytest.raises(InputError, match="class indices"):
        m.contribution(np.ones((3, 4)), np.array([0, 1, 2]))
    with pytest.raises(InputError, match="inf or NaN"):
        m.contribution(np.array([[1.0, np.inf, 0.0, 0.0]]), np.array([0]))
    with pytest.raises(InputError, match="8 integer counts"):
        m.select(np.zeros(7, dtype=np.int64))
    with pytest.raises(InputError, match="8 integer counts"):
        m.select(np.zeros(8))
    with pytest.raises(InputError, match="8 integer counts"):
        m.predict(np.eye(4), np.zeros(3, dtype=np.int64))
    with pytest.raises(InputError, match="finite with shape"):
        m.predict(np.ones((2, 3)), np.zeros(8, dtype=np.int64))
    with pytest.raises(InputError, match="inf or NaN"):
        m.votes(np.array([[np.nan, 0.0, 0.0, 0.0]]))
    with pytest.raises(InputError, match="at least one party"):
        run_public_prototype_votes([], mechanism=m)
