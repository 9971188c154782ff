"""Byte-identical streams: known-answer digests, a fresh process, and a baseline-x86-64 (no AVX) build.

Every party regenerates the queries on its own machine, so these digests are part of the protocol: if a
change to a generator alters them on purpose, the stream version in ``core._DOMAIN`` must change too and
the table below be regenerated with ``python tests/synth/test_synth_determinism.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from capc_common.synth import GENERATOR_NAMES, generate, images_digest

SHAPES = ((28, 28, 1), (32, 32, 3), (8, 8, 1), (64, 64, 3))
SEED, START, COUNT = 11, 1000, 16

# images_digest(generate(name, seed=11, start=1000, count=16, shape)) on the reference machine
KNOWN_DIGESTS = {
    "gaussian@28x28x1": "2adaab7cc2058d19c3a4da638e5d1782126efc78f050b50a4f97e7acde0ac6a8",
    "gaussian@32x32x3": "242ebe8b0f6151d5f61cf8925822614f3e030df5c8bf48e6a6f9e7da4aaaad5a",
    "gaussian@8x8x1": "7594b7ebcac33a20bfd733d2a0de875302c363d6bbb882d0da2bb90bebbedbd7",
    "gaussian@64x64x3": "acc8fe291b7bb0b817e6f5243a61dc11b8c3ca38514e796562e8cae0ae011515",
    "dead_leaves@28x28x1": "2926f51837bd3c26a52a16347194ad6344c269c2893d10e971871ae3e15229ea",
    "dead_leaves@32x32x3": "a40d7ad9f45987642268fe96f3d5dd9dc0940ca976e959064c5ff567ad69a2ca",
    "dead_leaves@8x8x1": "ac7ff6d75935d1d95f74798c83c5983fb2cd691d70715260d3ac39744c6379a4",
    "dead_leaves@64x64x3": "fe8f2bde67f858827dc72f3c9292a43f7dff54f5813c643cdd75f75a7f2ac420",
    "fractal@28x28x1": "cd0ae7cb3a4788cf0f34c11ee90920d7526da96652e3a301259ec9c8f03a9682",
    "fractal@32x32x3": "5cfe9564703dac0c7e11d307ef5be7c6531c3fc946b31f9fd840e03991302fd2",
    "fractal@8x8x1": "3f2bb50ce66e3ad4a0e60047922b74f8b213caff73a7d14614ca584b824dec54",
    "fractal@64x64x3": "3dfcd9219e4bc387380402732198f84c40df362a43e3349d81057badf7ac31a1",
    "stylegan@28x28x1": "b8933bbf5f0c9fa78b017eb0f2e2ef75efa1ab517d0191b5584efb8f8346e455",
    "stylegan@32x32x3": "2c802a58a93a9175fc5a741577a5727c020e5957cf426e42f42bc133c5a12230",
    "stylegan@8x8x1": "3e0b03126180d5c2a940e0a073a070a69baddeac2953d2e2fa148690add10353",
    "stylegan@64x64x3": "e01d00f5d31a8e48ca5f912432bfc77bee979b0bcdee9728ae9064fd2659783a",
    "shaders@28x28x1": "2171b73ffbb89dd84b3958f373535bd0aa1bd98638a6bc56542c2ea0adbc105d",
    "shaders@32x32x3": "b2fde6aa3261dca2eb1e3e8079cfbcea0329b2e5d9e552156999cdf991d732a3",
    "shaders@8x8x1": "b53200dc1e56c4e9abc6aee6898f88ab062a6481671eb25e7f28ae3fdaf1be1f",
    "shaders@64x64x3": "3eac6ea269ca201c446109af80f957ab18a0c24e5df01934c6ad04cb7829b488",
}


def digests(names: tuple[str, ...] = GENERATOR_NAMES) -> dict[str, str]:
    """The digest of every (generator, shape) in ``names`` x SHAPES."""
    result = {}
    for name in names:
        for h, w, c in SHAPES:
            images = generate(name, seed=SEED, start=START, count=COUNT, height=h, width=w, channels=c)
            result[f"{name}@{h}x{w}x{c}"] = images_digest(images)
    return result


def _in_subprocess(names: tuple[str, ...], env: dict[str, str]) -> dict[str, str]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import test_synth_determinism as t; "
        "print(json.dumps(t.digests(tuple(sys.argv[2:]))))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(__file__), *names],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **env},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", GENERATOR_NAMES)
def test_known_answers(name):
    expected = {k: v for k, v in KNOWN_DIGESTS.items() if k.startswith(f"{name}@")}
    assert digests((name,)) == expected


def test_fresh_process_gives_the_same_bytes():
    # a different hash seed and a separate interpreter: nothing may depend on process state
    assert _in_subprocess(GENERATOR_NAMES, {"PYTHONHASHSEED": "12345"}) == digests()


def test_baseline_x86_64_build_gives_the_same_bytes(tmp_path):
    """Recompile for a CPU without AVX/FMA (numba ``generic``): SIMD width must not change a bit.

    Compiling cold costs seconds per generator, so this checks one (RNG, log, sin, cos, sqrt,
    quantisation); docs/synth.md gives the command that checks all of them.
    """
    names = ("gaussian",)
    env = {"NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    assert _in_subprocess(names, env) == digests(names)


if __name__ == "__main__":  # regenerate the table after an intended change of the streams
    for key, value in digests().items():
        print(f'    "{key}": "{value}",')
