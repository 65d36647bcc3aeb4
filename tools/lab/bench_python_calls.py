#!/usr/bin/env python3
"""What a call costs from Python: a ping-pong of small tensors between two
stages (t = 1) through stagelink.Communicator with torch tensors, through
torch.distributed over gloo, and stagelink_perftest's one-way boundary time
from C, all on the same machine and in the same run; µs per one-way
message (round trip / 2, the median of the rounds), the median of L
launches of each, interleaved, and each against C.

    tools/lab/bench_python_calls.py [-b BUILD] [-s 4096] [-n 2000] [-r 5] [-l 3]

Runs its own ranks, once per peer, each peer in its own processes: by
default with the stagelink package this interpreter has installed (the
wheel of `pip install .`: its own library and tools, C and Python from
one build); with -b, a build tree's (configured for this interpreter,
-Dpython=, as its compiled _calls is).  SPDX-License-Identifier: MIT
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def rank_main(kind, size, iters, rounds):
    import torch
    rank = int(os.environ["RANK"])
    t = torch.zeros(size // 4, dtype=torch.float32)
    times = []
    if kind == "stagelink":
        import stagelink
        comm = stagelink.Communicator(tp_size=1, store=False)
        send = lambda: comm.send(t, peer="next" if rank == 0 else "prev")
        recv = lambda: comm.recv(t, peer="next" if rank == 0 else "prev")
        close = comm.close
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        other = 1 - rank
        send = lambda: dist.send(t, other)
        recv = lambda: dist.recv(t, other)
        close = dist.destroy_process_group
    for r in range(rounds + 1):
        start = time.perf_counter()
        for _ in range(iters):
            if rank == 0:
                send()
                recv()
            else:
                recv()
                send()
        if r > 0:  # the first round warms up
            times.append((time.perf_counter() - start) / (2 * iters) * 1e6)
    close()
    if rank == 0:
        print("RESULT %s %.2f" % (kind, statistics.median(times)),
              flush=True)


def run(tools, args, env):
    out = subprocess.run([os.path.join(tools, "stagelink_run"), "-n",
                          "2", "-T", "300", "--"] + args, env=env,
                         capture_output=True, text=True, timeout=320)
    if out.returncode != 0:
        return None, (out.stderr.strip().splitlines() or ["exit %d"
                                                          % out.returncode])[-1]
    return out.stdout, None


def measure(tools, kind, o, env):
    """One launch of one path: (us per one-way message, None), or (None,
    why it could not run)."""
    if kind == "c":
        csv, err = run(tools, [os.path.join(tools, "stagelink_perftest"),
                               "-g", "1", "-t", "boundary", "-s",
                               str(o.size), "-n", str(o.iters), "-w",
                               str(o.iters // 10), "--csv"], env)
        for line in (csv or "").splitlines():
            f = line.split(",")
            if f and f[0] == str(o.size):
                return float(f[6]), None  # avg_us: the one-way time
        return None, err
    out, err = run(tools, [sys.executable, os.path.abspath(__file__),
                           "--rank", kind, str(o.size), str(o.iters),
                           str(o.rounds)], env)
    for line in (out or "").splitlines():
        if line.startswith("RESULT "):
            return float(line.split()[2]), None
    return None, err or "no result"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                  int(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-b", "--build")
    ap.add_argument("-s", "--size", type=int, default=4096)
    ap.add_argument("-n", "--iters", type=int, default=2000)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("-l", "--launches", type=int, default=3)
    o = ap.parse_args()
    env = dict(os.environ)
    if o.build:
        build = os.path.abspath(o.build)
        tools = os.path.join(build, "tools")
        env.update(STAGELINK_PLUGIN_PATH=os.path.join(build, "plugin"),
                   STAGELINK_LIBRARY=os.path.join(build, "src",
                                                  "libstagelink.so"),
                   PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "..",
                                                            "python"),
                                               os.path.join(build, "python")]))
    else:
        for name in ("STAGELINK_PLUGIN_PATH", "STAGELINK_PLUGIN",
                     "STAGELINK_LIBRARY", "PYTHONPATH"):
            env.pop(name, None)
        # What the ranks will import, asked in their environment.
        found = subprocess.run(
            [sys.executable, "-c", "import os, sysconfig, stagelink._calls; "
             "print(stagelink.__version__, os.path.dirname("
             "stagelink.__file__), sysconfig.get_path('scripts'))"],
            env=env, capture_output=True, text=True)
        if found.returncode != 0:
            sys.exit("bench_python_calls.py: %s has no stagelink package "
                     "(%s): tools/make-venv.sh installs the wheel, or pass "
                     "-b BUILD" % (sys.executable, (found.stderr.strip()
                                                    .splitlines() or
                                                    ["?"])[-1]))
        version, where, tools = found.stdout.split()
        # Its console scripts: the wheel's tools, on the UCX it chose.
        print("# stagelink %s from %s" % (version, where))
    names = {"c": "C (stagelink_perftest -t boundary, avg)",
             "stagelink": "Python: stagelink.Communicator, torch tensors",
             "gloo": "Python: torch.distributed send/recv, gloo"}
    got = {kind: [] for kind in names}
    errors = {}
    # Launches interleaved: where the scheduler puts two ranks and their
    # progress threads on two cores changes a launch's figure by up to 2x.
    for _ in range(o.launches):
        for kind in names:
            us, err = measure(tools, kind, o, env)
            if us is None:
                errors[kind] = err
            else:
                got[kind].append(us)
    print("# one-way message, %d bytes, t = 1, two processes on this machine, "
          "us: median of %d launches (each: C's average, Python's median of "
          "%d rounds; %d round trips a round), and their range"
          % (o.size, o.launches, o.rounds, o.iters))
    print("%-48s %9s %13s %11s" % ("path", "us", "range", "minus C"))
    c_us = statistics.median(got["c"]) if got["c"] else None
    for kind, name in names.items():
        if not got[kind]:
            print("%-48s %9s  (could not run: %s)" % (name, "-",
                                                      errors.get(kind)))
            continue
        us = statistics.median(got[kind])
        print("%-48s %9.2f %13s %11s" % (
            name, us, "%.2f-%.2f" % (min(got[kind]), max(got[kind])),
            "-" if c_us is None or kind == "c" else "%+.2f" % (us - c_us)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
