"""A release party's backbone work in a process of its own, so the serving process never loads the model.

Secure-aggregation DP-SGD's teacher runs the backbone once, at start-up: the public basis (read from the
site's ``feature_cache``, the machine's shared one or the party's own holding the file the coordinator
shipped (:mod:`capc_services.common.basis`), or computed) and its records' per-example features. Loading
torch and the model costs a process about 250 MB that it never hands back, and the features were held beside
their normalised copy while they were projected. So :func:`featurise_apart` runs that work in a child process
(``python -m capc_services.teacher.featurise``), which writes the features to the site's records cache (or a
temporary file) a block at a time and exits before the serving process loads them (and normalises them in
place): the party's processes never hold the model and the features at once. Measured
(``benchmarks/memory.py --mechanism secagg-dpsgd --parties 3 --records 20000``, 17,941 records of 4,225
features per party, docs/results.md): the serving process's peak 1,035 MB before, 540 MB after (steady 651
against 446 MB); the child's own peak 427 MB beside the serving process's 110 MB.

The child computes exactly what the serving process computed before (the same functions; the features are
bit for bit those of one :func:`~capc_common.mechanisms.central.extract_per_example` call), and the serving
process checks the basis it is handed against ``federation.yaml``'s pin as if it had computed it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from capc_common import errors
from capc_common.errors import CapcError

if TYPE_CHECKING:
    from capc_common.federation.releases import ReleaseProtocol
    from capc_services.teacher.settings import TeacherSettings

#: Exit status of a child that refused (its error is on its standard output).
_REFUSED = 3


def featurise_apart(settings: TeacherSettings, protocol: ReleaseProtocol) -> npt.NDArray[np.float32]:
    """The site's records' per-example features, computed in a child process; what the protocol derives
    from public inputs (the basis) is computed there too and adopted by ``protocol``.

    Raises:
        CapcError: the child's refusal, as the same error (InputError, IntegrityError, ...).
    """
    with tempfile.TemporaryDirectory(prefix="capc-featurise-") as out:
        child = subprocess.run(
            [sys.executable, "-m", "capc_services.teacher.featurise", out, str(os.getpid())],
            input=settings.model_dump_json(),
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        try:
            found = json.loads(child.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            raise CapcError(
                f"the featurising process exited {child.returncode} without a result (see the log above)"
            ) from None
        if child.returncode != 0:
            kind = getattr(errors, str(found.get("error")), CapcError)
            raise (kind if isinstance(kind, type) and issubclass(kind, CapcError) else CapcError)(
                found.get("message", "the featurising process failed")
            )
        protocol.adopt({name: np.load(path, allow_pickle=False) for name, path in found["public"].items()})
        features = np.load(found["features"], allow_pickle=False)
    if features.dtype != np.float32 or features.ndim != 2:
        raise CapcError(f"the featurising process wrote {features.dtype} features of shape {features.shape}")
    return features


def featurise(settings: TeacherSettings, out: Path) -> dict[str, Any]:
    """The child's work: the protocol's public arrays and the records' features, as files; their paths.

    The records are read first (a site whose data does not load is refused before anything is computed),
    the public arrays computed before the records' features, not beside them.
    """
    from capc_common.dietpate.cache import FeatureCache
    from capc_common.federation import check_runnable
    from capc_common.learn import BackboneFeaturizer
    from capc_common.mechanisms.central import records_entry, write_per_example
    from capc_services.common.party import apply_threads
    from capc_services.teacher.train import party_examples

    images, _, _ = party_examples(settings)
    apply_threads(settings.torch_threads)
    runnable = check_runnable(settings.federation_config, model=True, cache=settings.feature_cache)
    public = {}
    for name, array in runnable.release_protocol().precomputed().items():
        public[name] = str(out / f"{name}.npy")
        np.save(public[name], array, allow_pickle=False)
    featurizer = BackboneFeaturizer(runnable.backbone)
    entry = records_entry(featurizer, images)
    cache = FeatureCache(settings.records_cache)
    path = cache.stored(entry, shape=(len(images), featurizer.feature_dim), dtype=np.float32)
    if path is None:
        path = cache.store_with(entry, lambda handle: write_per_example(featurizer, images, handle))
    if path is None:  # no records cache: a file of the parent's
        path = out / "features.npy"
        with path.open("wb") as handle:
            write_per_example(featurizer, images, handle)
    return {"public": public, "features": str(path)}


def end_with_parent(out: Path, parent: int) -> None:
    """End this process, and remove ``out``, when the serving process that started it dies (a party killed
    while its records are featurised): the kernel signals it (Linux's ``PR_SET_PDEATHSIG``), and a parent
    already gone before that was asked for is seen by :func:`os.getppid`. Without it the child would run
    its minute of work to the end and leave up to a few hundred MB of features in a directory nobody
    removes. The signal ends it as an exception, so a cache file being written is removed, not left half
    written."""
    import ctypes
    import shutil

    def stop(signum: int, frame: object) -> None:
        shutil.rmtree(out, ignore_errors=True)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:
        stop(signal.SIGTERM, None)


def main() -> None:
    """``python -m capc_services.teacher.featurise OUT PARENT_PID``: the site's settings (JSON) on standard
    input, the result (JSON) as the last line of standard output."""
    from capc_services.teacher.settings import TeacherSettings

    end_with_parent(Path(sys.argv[1]), int(sys.argv[2]))
    try:
        settings = TeacherSettings.model_validate_json(sys.stdin.read())
        result: dict[str, Any] = featurise(settings, Path(sys.argv[1]))
    except CapcError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        sys.exit(_REFUSED)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
