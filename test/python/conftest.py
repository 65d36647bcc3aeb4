"""What every Python test shares: soft checks, the job it runs in, its
needs, and the options a run passes (--tp, --cp, --project-version,
--build-root).

A test of several ranks runs as a job: stagelink_run (or torchrun) starts
pytest in every rank on the same file, so the tests run in file order on
every rank and their transfers pair up.  check() is a soft assertion: a
failed check does not stop its test, whose peers still wait for the
transfers after it; the test fails at its end, naming every failed check.
A file whose needs are missing skips whole, and a run where every test
skipped exits 77, which meson and stagelink_run read as a skip.

SPDX-License-Identifier: MIT
"""
import contextlib
import importlib
import os

import pytest

_failed = []  # the running test's failed checks


def check(cond, what):
    """Records `what` as failed unless `cond`; the test goes on."""
    if not cond:
        _failed.append(what)
        print("FAIL:", what, flush=True)


@contextlib.contextmanager
def module_comm(request, comm):
    """`comm` for a module's tests, closed after them; aborted first when a
    test failed, so the peers fail at once instead of waiting for this
    rank's transfers until their deadline."""
    try:
        yield comm
    finally:
        if request.session.testsfailed:
            comm.abort()
        comm.close()


def require(*modules, why=""):
    """The modules, imported; else the whole file skips (for every rank
    alike: a rank skipping alone would leave its peers waiting)."""
    try:
        return [importlib.import_module(m) for m in modules]
    except ImportError as e:
        pytest.skip("%s%s" % (e, " (%s)" % why if why else ""),
                    allow_module_level=True)


def require_cuda():
    """torch, once it sees a CUDA device; else the whole file skips."""
    torch, = require("torch", why="install python3-torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device (torch %s, built with CUDA %s)"
                    % (torch.__version__, torch.version.cuda),
                    allow_module_level=True)
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) %
                          torch.cuda.device_count())
    return torch


def pytest_addoption(parser):
    parser.addoption("--tp", type=int, default=1,
                     help="the job's tensor-parallel size t")
    parser.addoption("--cp", type=int, default=1,
                     help="the job's context-parallel size")
    parser.addoption("--project-version", default=None,
                     help="the version meson gives the project")
    parser.addoption("--build-root", default=None,
                     help="the meson build tree whose tools a test runs")


@pytest.fixture(scope="session")
def tp(request):
    return request.config.getoption("--tp")


@pytest.fixture(scope="session")
def cp(request):
    return request.config.getoption("--cp")


@pytest.fixture(scope="session")
def world():
    """WORLD_SIZE, as the launcher set it."""
    return int(os.environ["WORLD_SIZE"])


@pytest.fixture(scope="session")
def rank():
    return int(os.environ["RANK"])


@pytest.fixture(scope="module")
def gloo_job():
    """torch.distributed's default group over gloo for the module (env://:
    the launcher's MASTER_ADDR and MASTER_PORT)."""
    import torch.distributed as dist
    dist.init_process_group("gloo")
    yield dist
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _soft_checks():
    del _failed[:]
    yield
    del _failed[:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "call" and _failed and report.passed:
        report.outcome = "failed"
        report.longrepr = "%d check(s) failed:\n%s" % (
            len(_failed), "\n".join("  " + f for f in _failed))


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = reporter.stats if reporter is not None else {}
    if exitstatus in (0, 5) and stats.get("skipped") and not any(
            stats.get(k) for k in ("passed", "failed", "error")):
        session.exitstatus = 77
