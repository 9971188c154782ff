"""A release party's backbone work in a process of its own, so the serving process never loads the model.

Secure-aggregation DP-SGD's teacher runs the backbone once, at start-up: the public basis (read from the
site's ``feature_cache``, the machine's shared one or the party's own holding the file the coordinator
shipped (:mod:`capc_services.common.basis`), or computed) and its records' per-example features. Loading
torch and the model costs a process memory it never hands back, and the features were held beside their
normalised copy while they were projected. So :func:`featurise_apart` runs that work in a child process
(``python -m capc_services.teacher.featurise``), which writes the features to the site's records cache, or
without one to an anonymous file of the serving process's (no name on any disk: the features of private
records vanish with the last process holding it, however both end), a block at a time, and exits before the
serving process loads them (and normalises them in place): the party's processes never hold the model and
the features at once (measured in docs/results.md, "Party memory").

The child computes exactly what the serving process computed before (the same functions; the features are
bit for bit those of one :func:`~capc_common.mechanisms.central.extract_per_example` call), and the serving
process checks what it is handed as if it had computed it: the basis against ``federation.yaml``'s pin, the
features' shape against the backbone, and that the child read the same ``federation.yaml`` and the same
records as the party did at start (neither edited in between).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, BinaryIO

import numpy as np
import numpy.typing as npt

from capc_common import errors
from capc_common.errors import CapcError, InputError

if TYPE_CHECKING:
    from capc_common.federation.releases import ReleaseProtocol
    from capc_services.teacher.settings import TeacherSettings

#: Exit status of a child that refused (its error is on its standard output).
_REFUSED = 3
#: How often the serving process looks at its stop event while the child works.
_POLL_S = 0.5
#: How long a child asked to stop (SIGTERM) may take before it is killed.
_STOP_GRACE_S = 30.0
#: What the child's result holds: the public arrays in the order they precede the features in the anonymous
#: file, the records cache's file of the features (None: in the anonymous file after the arrays), and what it
#: read: federation.yaml's config hash and the records' content digest.
_RESULT_KEYS = {"public", "features", "config", "records"}


@dataclass(frozen=True)
class Expected:
    """What the serving process read at start, which the child must have read too.

    Attributes:
        config: ``federation.yaml``'s :meth:`~capc_common.federation.FederationConfig.config_hash`.
        records: the records' :func:`~capc_common.mechanisms.central.records_digest`.
        feature_dim: the backbone's feature length (from its file: the serving process loads no model).
    """

    config: str
    records: str
    feature_dim: int


def featurise_apart(
    settings: TeacherSettings, protocol: ReleaseProtocol, *, expected: Expected, stop: threading.Event
) -> npt.NDArray[np.float32] | None:
    """The site's records' per-example features, computed in a child process; what the protocol derives
    from public inputs (the basis) is computed there too and adopted by ``protocol``. None once ``stop`` is
    set: the child is asked to stop (SIGTERM: it removes what it was writing) and waited for.

    Raises:
        CapcError: the child's refusal, as the same error (InputError, IntegrityError, ...); its end without a
            result (killed by a signal: named); a result that is not what the party expects (InputError:
            federation.yaml or the records changed meanwhile; CapcError: features of another shape).
    """
    # O_TMPFILE where the file system has it (no name ever), else a file unlinked as soon as it is created:
    # the child writes through the descriptor it inherits.
    if stop.is_set():
        return None
    with tempfile.TemporaryFile(prefix="capc-featurise-") as out:
        found = _run_child(settings, out.fileno(), stop=stop)
        if found is None:
            return None
        if found["config"] != expected.config:
            raise InputError(
                f"federation.yaml changed while this party featurised its records (config hash "
                f"{expected.config[:12]}… at start, {str(found['config'])[:12]}… now): restart the party"
            )
        if found["records"] != expected.records:
            raise InputError(
                "the site's records changed while this party featurised them (their content is not what "
                "it read at start): restart the party"
            )
        if set(found["public"]) != set(protocol.precomputed_names()):
            raise CapcError(
                f"the featurising process handed over {sorted(found['public'])}; this protocol derives "
                f"{sorted(protocol.precomputed_names())}"
            )
        out.seek(0)
        try:
            protocol.adopt({name: np.load(out, allow_pickle=False) for name in found["public"]})
            features = np.load(out if found["features"] is None else found["features"], allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise CapcError(
                f"what the featurising process wrote does not load ({type(exc).__name__}: {exc}): restart "
                "the party; if it recurs, check the disk holding its temporary files and records cache"
            ) from None
    if features.dtype != np.float32 or features.ndim != 2 or features.shape[1] != expected.feature_dim:
        raise CapcError(
            f"the featurising process wrote {features.dtype} features of shape {features.shape}; the "
            f"backbone gives float32 rows of {expected.feature_dim}"
        )
    return features


def _run_child(settings: TeacherSettings, fd: int, *, stop: threading.Event) -> dict[str, Any] | None:
    """Run the child on ``fd`` until it ends (its result) or ``stop`` is set (None). Its standard error (its
    log) is relayed to this process's as it comes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "capc_services.teacher.featurise", str(fd), str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(fd,),
        text=True,
        encoding="utf-8",
        errors="replace",
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdout: list[str] = []
    logged = threading.Event()
    readers = [
        threading.Thread(target=_read, args=(proc.stdout, stdout), daemon=True),
        threading.Thread(target=_relay, args=(proc.stderr, logged), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        try:
            proc.stdin.write(settings.model_dump_json())
            proc.stdin.close()
        except BrokenPipeError:  # it ended before reading them: its exit status says why
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        while proc.poll() is None:
            if stop.wait(_POLL_S):
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):  # killed below
                    proc.wait(timeout=_STOP_GRACE_S)
                break  # asked once, waited the grace: what still runs is killed below
    finally:
        if proc.poll() is None:  # this process failed, or the child ignored SIGTERM
            proc.kill()
            proc.wait()
        for reader in readers:
            reader.join(timeout=5)
    if stop.is_set():  # the child ended because the party stops (a signal to the group, or ours)
        return None
    return _result(proc.returncode, "".join(stdout), logged=logged.is_set())


def _read(stream: IO[str], into: list[str]) -> None:
    """Read the child's standard output to its end (a pipe never left full while the child works)."""
    into.append(stream.read())


def _relay(stream: IO[str], logged: threading.Event) -> None:
    """Copy the child's standard error to this process's, noting that it wrote anything."""
    for line in stream:
        logged.set()
        sys.stderr.write(line)
        sys.stderr.flush()


def _result(returncode: int, stdout: str, *, logged: bool) -> dict[str, Any]:
    """The child's result, or its refusal or its end without one as an error."""
    try:
        found = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        found = None
    if returncode == _REFUSED and isinstance(found, dict):
        kind = getattr(errors, str(found.get("error")), CapcError)
        raise (kind if isinstance(kind, type) and issubclass(kind, CapcError) else CapcError)(
            str(found.get("message", "the featurising process failed"))
        )
    if returncode != 0 or not isinstance(found, dict):
        see = " (see the log above)" if logged else ""
        raise CapcError(f"the featurising process {_ended(returncode)} without a result{see}")
    names, path = found.get("public"), found.get("features")
    well_formed = isinstance(names, list) and all(isinstance(name, str) for name in names)
    if set(found) != _RESULT_KEYS or not well_formed or not (path is None or isinstance(path, str)):
        raise CapcError(f"the featurising process gave a result this party cannot read: {stdout:.200}")
    return found


def _ended(returncode: int) -> str:
    """How the child ended, in words: a signal by name (SIGKILL: the kernel's out-of-memory killer, most
    likely), a stop it was asked for (its own exit status 128 + the signal), or its exit status."""
    if returncode < 0:
        name = _signal_name(-returncode)
        if -returncode == signal.SIGKILL:
            return (
                f"was killed by {name} — most likely out of memory: raise the teacher's memory limit "
                "(docs/operations.md, 'Memory: requests and limits'), or give the site a records_cache and "
                "a feature_cache so a restart reuses what was featurised"
            )
        return f"was killed by {name}"
    if returncode - 128 in (signal.SIGTERM, signal.SIGINT):
        return f"was stopped by {_signal_name(returncode - 128)}"
    return f"exited {returncode}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def featurise(settings: TeacherSettings, out: BinaryIO) -> dict[str, Any]:
    """The child's work: the protocol's public arrays, then the records' features (unless the records cache
    holds them), written to ``out`` as ``.npy`` arrays one after the other; what :func:`_result` reads.

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
    config = settings.federation_config
    apply_threads(settings.torch_threads)
    runnable = check_runnable(config, model=True, cache=settings.feature_cache)
    public = []
    for name, array in runnable.release_protocol().precomputed().items():
        np.save(out, array, allow_pickle=False)
        public.append(name)
    featurizer = BackboneFeaturizer(runnable.backbone)
    entry = records_entry(featurizer, images)

    def write(handle: BinaryIO) -> None:
        write_per_example(featurizer, images, handle)

    cache = FeatureCache(settings.records_cache)
    path = cache.stored(entry, shape=(len(images), featurizer.feature_dim), dtype=np.float32)
    if path is None:
        path = cache.store_with(entry, write)  # None: no records cache
    if path is None:
        write(out)
    out.flush()
    features = None if path is None else str(path)
    return {
        "public": public,
        "features": features,
        "config": config.config_hash(),
        "records": entry["content"],
    }


def end_with_parent(parent: int) -> None:
    """End this process when the serving process that started it dies (a party killed while its records are
    featurised), or when it is asked to stop (SIGTERM; SIGINT too: a ^C reaches the terminal's whole process
    group): the kernel signals it at its parent's death (Linux's ``PR_SET_PDEATHSIG``), and a parent already
    gone before that was asked for is seen by :func:`os.getppid`. Without it the child would run its minute
    of work to the end for nobody. The signal ends it as an exception (no traceback), so a records cache file
    being written is removed, not left half written; what it wrote to its parent's anonymous file goes with
    the last descriptor of it."""
    import ctypes

    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        # Once: a ^C reaches this process and its parent, which then sends SIGTERM too; a second exception
        # raised while the first unwinds (or in the interpreter's shutdown) would print a traceback. (Not
        # SIG_IGN: a signal already pending then raises OSError "ignored due to race condition".)
        if not stopping.is_set():
            stopping.set()
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, stop)  # first: a party that sees SIGTERM handled may send either
    signal.signal(signal.SIGTERM, stop)
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:
        stop(signal.SIGTERM, None)


def main() -> None:
    """``python -m capc_services.teacher.featurise FD PARENT_PID``: the site's settings (JSON) on standard
    input, the arrays written to the inherited descriptor ``FD``, the result (JSON) as the last line of
    standard output."""
    from capc_services.teacher.settings import TeacherSettings

    end_with_parent(int(sys.argv[2]))
    try:
        settings = TeacherSettings.model_validate_json(sys.stdin.read())
        with os.fdopen(int(sys.argv[1]), "wb") as out:
            result: dict[str, Any] = featurise(settings, out)
    except CapcError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        sys.exit(_REFUSED)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
