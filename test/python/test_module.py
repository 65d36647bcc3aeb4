"""The package without a communicator: status names agree with the
library's, the exception classes, the version, and what a user sees when
libstagelink cannot be found (a clear StagelinkError, not a bare OSError).
Usage: pytest test_module.py --project-version VERSION
SPDX-License-Identifier: MIT
"""
import builtins
import os
import pickle
import subprocess
import sys

import pytest

import stagelink
from conftest import check
from stagelink import _lib, errors


def test_status_names():
    lib = _lib.library()
    for code, name in enumerate(errors.STATUS_NAMES):
        got = lib.status_string(code)
        check(got == "STAGELINK_" + name, "status %d: the library says %s, "
              "the package %s" % (code, got, name))
    check(lib.status_string(len(errors.STATUS_NAMES)) ==
          "STAGELINK_ERR_UNKNOWN_STATUS", "the library has statuses the "
          "package does not know")


def test_versions(request):
    want = request.config.getoption("--project-version")
    check(stagelink.__version__ == want == stagelink.library_version(),
          "versions: package %s, meson %s, library %s" % (
              stagelink.__version__, want, stagelink.library_version()))


@pytest.mark.parametrize("name, kind", [
    ("ERR_PEER_FAILED", stagelink.PeerFailedError),
    ("ERR_TIMEOUT", stagelink.TimeoutError),
    ("ERR_SIZE_MISMATCH", stagelink.SizeMismatchError),
    ("ERR_ABORTED", stagelink.AbortedError),
    ("ERR_CANCELED", stagelink.CanceledError),
    ("ERR_TAG_IN_USE", stagelink.TagInUseError),
    ("ERR_INVALID_ARG", stagelink.InvalidArgumentError),
    ("ERR_TRANSPORT", stagelink.StagelinkError)])
def test_exception_kinds(name, kind):
    e = errors.error(errors.STATUS[name], "a sentence")
    check(type(e) is kind and isinstance(e, stagelink.StagelinkError) and
          isinstance(e, RuntimeError) and e.status == name and
          str(e) == name + ": a sentence", "%s gives %r" % (name, e))
    back = pickle.loads(pickle.dumps(e))
    check(type(back) is kind and str(back) == str(e), "pickled %r" % e)


def test_exception_bases():
    check(issubclass(stagelink.TimeoutError, builtins.TimeoutError),
          "stagelink.TimeoutError is no builtin TimeoutError")
    check(issubclass(stagelink.ShapeMismatchError,
                     stagelink.SizeMismatchError),
          "ShapeMismatchError is no SizeMismatchError")
    check(issubclass(stagelink.InvalidArgumentError, ValueError),
          "InvalidArgumentError is no ValueError")


def test_library_missing():
    """No library where it is looked for: one sentence saying what to do."""
    env = dict(os.environ, STAGELINK_LIBRARY="/nonexistent/libstagelink.so.1")
    out = subprocess.run([sys.executable, "-c",
                          "import stagelink; stagelink.Communicator()"],
                         env=env, capture_output=True, text=True, timeout=60)
    last = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
    check(out.returncode != 0 and
          last.startswith("stagelink.errors.StagelinkError: ERR_NOT_FOUND")
          and "STAGELINK_LIBRARY" in last and "meson devenv" in last,
          "a missing library: %s" % last)


@pytest.mark.parametrize("value, want", [
    ("on", "True"), ("Yes", "True"), ("off", "False"),
    ("2", 'ERR_CONFIG: STAGELINK_CHECK="2" is not valid')])
def test_check_variable_parsed(value, want):
    """The package's own variables go through the library's one parser."""
    probe = ("import stagelink; from stagelink import _check\n"
             "try:\n    print(_check.enabled())\n"
             "except stagelink.StagelinkError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", probe],
                         env=dict(os.environ, STAGELINK_CHECK=value),
                         capture_output=True, text=True, timeout=60)
    check(out.stdout.startswith(want), "STAGELINK_CHECK=%s: %s%s" % (
        value, out.stdout, out.stderr[-300:]))


def test_ucx_variable_parsed():
    out = subprocess.run([sys.executable, "-c", "import stagelink; "
                          "stagelink.Communicator()"],
                         env=dict(os.environ, STAGELINK_UCX="sytem"),
                         capture_output=True, text=True, timeout=60)
    check(out.returncode != 0 and 'STAGELINK_UCX="sytem" is not valid' in
          out.stderr, "STAGELINK_UCX=sytem: %s" % out.stderr[-300:])


def test_settings_read_back():
    chunk, timeout = (_lib.setting("STAGELINK_CHUNK"),
                      _lib.setting("STAGELINK_TIMEOUT"))
    check(chunk == "auto" and float(timeout) > 0,
          "settings read back: %s, %s" % (chunk, timeout))


def test_store_wait_unbounded(monkeypatch):
    """STAGELINK_TIMEOUT=0 waits forever: a key that comes after the
    store's own timeout (torch's store.get would give up) is still read."""
    dist = pytest.importorskip("torch.distributed")
    import datetime
    import threading
    from stagelink import _store

    monkeypatch.setenv("STAGELINK_TIMEOUT", "0")
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(milliseconds=200))
    boot = _store.StoreBootstrap(store)
    late = threading.Timer(1.0, store.set, (boot.prefix + "k", b"v"))
    late.start()
    try:
        got = boot.get("k")
    finally:
        late.join()
    check(got == b"v", "the late key: %r (error %r)" % (got, boot.error))


def test_store_numbers_per_world():
    """Communicators are numbered from 0 again in each new torch world
    (an in-process restart), whatever the old world's creations reached on
    this rank; stores given by hand without a world keep counting."""
    dist = pytest.importorskip("torch.distributed")
    from stagelink import _store

    if dist.is_initialized():
        pytest.skip("torch.distributed is initialized already")
    outside = [_store.StoreBootstrap(dist.HashStore()).prefix
               for _ in range(2)]
    prefixes = []
    try:
        for world in range(2):
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0,
                                    world_size=1)
            # The old world got further on this rank in the first round.
            prefixes.append([_store.StoreBootstrap(dist.HashStore()).prefix
                             for _ in range(3 - world)])
            dist.destroy_process_group()
        after = _store.StoreBootstrap(dist.HashStore()).prefix
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    want = [["stagelink/%d/" % i for i in range(3 - w)] for w in range(2)]
    check(prefixes == want, "prefixes in two worlds: %r, want %r"
          % (prefixes, want))
    check(outside[1] != outside[0] and after == "stagelink/2/",
          "without a world: %r, then %r after the worlds (want counting on)"
          % (outside, after))
