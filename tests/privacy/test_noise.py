"""Discrete Gaussian / Laplace samplers: exact tables, statistics of draws, determinism, misuse."""

from __future__ import annotations

import math
import os
import select
import signal
import threading
import warnings

import numpy as np
import pytest
from scipy import stats

from capc_common.errors import InputError
from capc_common.privacy import InsecureNoiseWarning, NoiseSource, SeededNoise, SystemNoise
from capc_common.privacy.noise import (
    bernoulli_exp_neg,
    discrete_gaussian_exact,
    discrete_gaussian_table,
    discrete_laplace_exact,
    discrete_laplace_table,
)
from capc_common.privacy.noise import source as source_module

VARIANCE_SIGMA2_1 = 0.9999997887677282  # reference/accounting.md


@pytest.fixture(autouse=True)
def _quiet_seeded_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureNoiseWarning)
        yield


def _gaussian_pmf(sigma: float, radius: int) -> np.ndarray:
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    w = np.exp(-(x**2) / (2 * sigma**2))
    return w / w.sum()


def _laplace_pmf(scale: float, radius: int) -> np.ndarray:
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    w = np.exp(-np.abs(x) / scale)
    return w / w.sum()


def _chi_square_pvalue(draws: np.ndarray, pmf: np.ndarray, radius: int) -> float:
    """Chi-square goodness of fit, merging the tails into cells with expected count ≥ 5."""
    counts = np.bincount(draws + radius, minlength=pmf.size).astype(np.float64)
    expected = pmf * draws.size
    keep = expected >= 5
    lo, hi = np.flatnonzero(keep)[[0, -1]]
    obs = np.concatenate([[counts[: lo + 1].sum()], counts[lo + 1 : hi], [counts[hi:].sum()]])
    exp = np.concatenate([[expected[: lo + 1].sum()], expected[lo + 1 : hi], [expected[hi:].sum()]])
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.mark.parametrize("sigma", [0.3, 1.0, 7.5, 40.0, 120.0])
def test_gaussian_table_matches_exact_pmf(sigma: float) -> None:
    table = discrete_gaussian_table(sigma=sigma)
    assert table.distance_bound <= 2.0**-90
    expected = _gaussian_pmf(sigma, table.radius)
    np.testing.assert_allclose(table.pmf(), expected, rtol=1e-12, atol=2.0**-126)
    # The mass the table leaves out beyond ±K is below 2^-96.
    wide = _gaussian_pmf(sigma, table.radius + 200)
    assert 2 * wide[:200].sum() <= 2.0**-96


def test_gaussian_table_variance_is_the_known_value() -> None:
    table = discrete_gaussian_table(sigma=1.0)
    x = np.arange(-table.radius, table.radius + 1)
    variance = float(np.sum(table.pmf() * x**2))
    assert math.isclose(variance, VARIANCE_SIGMA2_1, rel_tol=1e-12)


@pytest.mark.parametrize("scale", [0.5, 2.0, 25.0])
def test_laplace_table_matches_exact_pmf(scale: float) -> None:
    table = discrete_laplace_table(scale=scale)
    assert table.distance_bound <= 2.0**-90
    np.testing.assert_allclose(table.pmf(), _laplace_pmf(scale, table.radius), rtol=1e-12, atol=2.0**-126)


@pytest.mark.parametrize("sigma", [1.0, 40.0])
def test_gaussian_draws_fit_the_pmf(sigma: float) -> None:
    n = 200_000
    draws = SeededNoise(b"fit-%g" % sigma).discrete_gaussian(sigma=sigma, shape=(n,))
    assert draws.dtype == np.int64 and draws.shape == (n,)
    table = discrete_gaussian_table(sigma=sigma)
    pmf = _gaussian_pmf(sigma, table.radius)
    x = np.arange(-table.radius, table.radius + 1)
    variance = float(np.sum(pmf * x**2))
    if sigma == 1.0:
        assert math.isclose(variance, VARIANCE_SIGMA2_1, rel_tol=1e-12)
    kurt4 = float(np.sum(pmf * x**4))
    assert abs(draws.mean()) < 5 * math.sqrt(variance / n)
    assert abs(draws.var() - variance) < 5 * math.sqrt((kurt4 - variance**2) / n)
    assert _chi_square_pvalue(draws, pmf, table.radius) > 1e-4


def test_system_noise_draws_fit_the_pmf() -> None:
    n = 100_000
    draws = SystemNoise().discrete_gaussian(sigma=1.0, shape=(n,))
    table = discrete_gaussian_table(sigma=1.0)
    assert abs(draws.mean()) < 6 * math.sqrt(VARIANCE_SIGMA2_1 / n)
    assert abs(draws.var() - VARIANCE_SIGMA2_1) < 6 * math.sqrt(2 / n)
    assert _chi_square_pvalue(draws, _gaussian_pmf(1.0, table.radius), table.radius) > 1e-6


def test_laplace_draws_fit_the_pmf() -> None:
    n, scale = 100_000, 3.0
    draws = SeededNoise(b"laplace").discrete_laplace(scale=scale, shape=(n,))
    q = math.exp(-1 / scale)
    variance = 2 * q / (1 - q) ** 2
    assert abs(draws.mean()) < 5 * math.sqrt(variance / n)
    table = discrete_laplace_table(scale=scale)
    assert _chi_square_pvalue(draws, _laplace_pmf(scale, table.radius), table.radius) > 1e-4


def test_exact_reference_sampler_fits_the_pmf_and_agrees_with_the_table() -> None:
    n, sigma = 12_000, 1.5
    exact = discrete_gaussian_exact(sigma=sigma, n=n, source=SeededNoise(b"exact"))
    radius = discrete_gaussian_table(sigma=sigma).radius
    assert _chi_square_pvalue(exact, _gaussian_pmf(sigma, radius), radius) > 1e-4
    fast = SeededNoise(b"fast").discrete_gaussian(sigma=sigma, shape=(n,))
    # Two-sample homogeneity test on the central cells (|x| ≤ 4 holds > 99.9 % of the mass).
    table = np.array([[np.sum(np.clip(s, -5, 5) == v) for v in range(-5, 6)] for s in (exact, fast)])
    table = table[:, table.min(axis=0) > 0]
    assert stats.chi2_contingency(table).pvalue > 1e-4


def test_exact_laplace_and_bernoulli_reference() -> None:
    n, scale = 10_000, 2.5
    draws = discrete_laplace_exact(scale=scale, n=n, source=SeededNoise(b"exact-lap"))
    radius = discrete_laplace_table(scale=scale).radius
    assert _chi_square_pvalue(draws, _laplace_pmf(scale, radius), radius) > 1e-4
    for gamma in (0.0, 0.4, 1.0, 2.75):
        bits = bernoulli_exp_neg(gamma=gamma, n=4000, source=SeededNoise(b"bern"))
        p = math.exp(-gamma)
        assert abs(bits.mean() - p) <= 5 * math.sqrt(p * (1 - p) / 4000) + 1e-12


def test_same_seed_same_calls_same_draws() -> None:
    def run(noise: NoiseSource) -> list[np.ndarray]:
        return [
            noise.discrete_gaussian(sigma=120.0, shape=(7,)),
            noise.discrete_gaussian(sigma=40.0, shape=(7, 10)),
            noise.discrete_laplace(scale=4.0, shape=(3,)),
            noise.uniform_words(5),
        ]

    a, b, c = run(SeededNoise(b"seed")), run(SeededNoise(b"seed")), run(SeededNoise(b"other"))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[1], c[1])
    # A str seed is its UTF-8 bytes.
    np.testing.assert_array_equal(SeededNoise("seed").uniform_words(4), SeededNoise(b"seed").uniform_words(4))


def test_seeded_stream_is_aes_ctr_keyed_by_sha256_of_the_seed() -> None:
    import hashlib

    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    key = hashlib.sha256(b"vector").digest()
    stream = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor().update(bytes(32))
    expected = np.frombuffer(stream, dtype="<u8")
    np.testing.assert_array_equal(SeededNoise(b"vector").uniform_words(4), expected)


class _ScriptedWords(NoiseSource):
    """Replays a fixed list of words (to hit the rare tie between a drawn word and a table word)."""

    secure = False

    def __init__(self, words: list[int]) -> None:
        self._words = list(words)

    def uniform_words(self, n: int) -> np.ndarray:
        out, self._words = self._words[:n], self._words[n:]
        assert len(out) == n, "scripted source ran out of words"
        return np.array(out, dtype=np.uint64)


def test_tied_high_word_is_resolved_by_a_second_word_exactly() -> None:
    table = discrete_gaussian_table(sigma=2.0)
    cdf = [(int(h) << 64) | int(lo) for h, lo in zip(table.high, table.low, strict=True)]
    # The left tail has several cells whose cumulative probability shares high word 0.
    assert table.high[0] == table.high[1] == 0
    fillers = [2**63 + 12345, 2**62 + 999]
    assert not np.isin(np.array(fillers, dtype=np.uint64), table.high).any()
    for j in (0, 1, 2, len(cdf) - 1):
        for low in (int(table.low[j]) - 1, int(table.low[j]), int(table.low[j]) + 1):
            high = int(table.high[j])
            if not 0 <= low < 2**64:
                continue
            u = (high << 64) | low
            want = next((i for i, c in enumerate(cdf) if c > u), len(cdf)) - table.radius
            got = table.sample(_ScriptedWords([fillers[0], high, fillers[1], low]), (3,))
            fill = [table.index_of(w, 0) - table.radius for w in fillers]
            assert got.tolist() == [fill[0], want, fill[1]]


def test_system_noise_rekeys_in_a_forked_child() -> None:
    noise = SystemNoise()
    noise.uniform_words(1)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.write(write_fd, noise.uniform_words(4).tobytes())
        os._exit(0)
    os.close(write_fd)
    child = np.frombuffer(os.read(read_fd, 32), dtype=np.uint64)
    os.waitpid(pid, 0)
    os.close(read_fd)
    assert child.size == 4
    assert not np.array_equal(child, noise.uniform_words(4))
    assert SystemNoise.secure and not SeededNoise.secure


def test_system_noise_is_usable_in_a_child_forked_while_another_thread_draws() -> None:
    # A thread of the parent holds the source's lock at the moment of the fork: the child must neither
    # deadlock on that lock nor continue the parent's keystream.
    noise = SystemNoise()
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with noise._lock:
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.write(write_fd, noise.uniform_words(4).tobytes())
        os._exit(0)
    os.close(write_fd)
    release.set()
    holder.join()
    ready, _, _ = select.select([read_fd], [], [], 10)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    child = np.frombuffer(os.read(read_fd, 32), dtype=np.uint64) if ready else np.zeros(0, np.uint64)
    os.close(read_fd)
    assert child.size == 4, "the forked child deadlocked on the noise source's lock"
    assert not np.array_equal(child, noise.uniform_words(4))


def test_seeded_noise_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source_module, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SeededNoise(b"a")
        SeededNoise(b"b")
    assert [w.category for w in caught] == [InsecureNoiseWarning]
    assert "differentially private" in str(caught[0].message)


@pytest.mark.parametrize("sigma", [0.0, -1.0, float("nan"), float("inf"), 1e6, "3"])
def test_bad_sigma_is_refused(sigma: object) -> None:
    with pytest.raises(InputError, match="sigma"):
        SystemNoise().discrete_gaussian(sigma=sigma, shape=(2,))  # type: ignore[arg-type]


def test_bad_shapes_counts_and_seeds_are_refused() -> None:
    noise = SystemNoise()
    with pytest.raises(InputError, match="shape"):
        noise.discrete_gaussian(sigma=1.0, shape=(-1,))
    with pytest.raises(InputError, match="scale"):
        noise.discrete_laplace(scale=0.0, shape=(1,))
    with pytest.raises(InputError, match="non-negative"):
        noise.uniform_words(-3)
    with pytest.raises(InputError, match="seed"):
        SeededNoise(1234)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="gamma"):
        bernoulli_exp_neg(gamma=-0.5, n=1, source=noise)
    assert noise.discrete_gaussian(sigma=1.0, shape=(0, 3)).shape == (0, 3)
