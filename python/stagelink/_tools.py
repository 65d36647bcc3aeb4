"""The C tools a wheel carries (stagelink_run, stagelink_info,
stagelink_perftest), started with the UCX the package chose, so that they
and the ranks they start load the same UCX as `import stagelink` does.

SPDX-License-Identifier: MIT
"""

import os
import sys

from . import _ucx
from .errors import StagelinkError


def _exec(name):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin",
                        name)
    if not os.access(path, os.X_OK):
        sys.exit("%s: not in this package (%s); it is installed with the "
                 "C library by meson install" % (name, path))
    env = dict(os.environ)
    try:
        _ucx.export(env)
    except StagelinkError as e:
        sys.exit("%s: %s" % (name, e))
    os.execve(path, [name] + sys.argv[1:], env)


def stagelink_run():
    _exec("stagelink_run")


def stagelink_info():
    _exec("stagelink_info")


def stagelink_perftest():
    _exec("stagelink_perftest")
