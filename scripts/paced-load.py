#!/usr/bin/env python3
"""Updates arriving one at a time: where a live load's CPU goes.

Starts SERVER on a Unix socket in a fresh private directory (`--cache
none`), loads concord-bench's live-query store (100,000 posts by 1,000
authors), then sends the live-query mix from one connection — half merge
a post's date, three in ten move a post to another author, two in ten
rename an author (a hundred posts each) — RATE updates a second for
SECONDS, each write holding what is due (mostly one line). It prints the
server's CPU per update, split by thread (user and system time from
/proc), and, when `perf` is installed, the events of --perf-events per
update over the same interval (system calls by default).

    scripts/paced-load.py .build/release/concord-server [--rate 5000]
        [--seconds 3] [--mix date|author|rename] [--perf-events LIST]

The run is bounded (SECONDS, then the server is stopped by its PID) and
talks only over its own Unix socket. Callgrind does not see what this
measures: the kernel's hand-offs between the loop and the sequencer, and
the cache misses of an update that arrives alone (docs/ARCHITECTURE.md,
"What moved it in stop 43").
"""
import argparse, glob, os, random, shutil, signal, socket, subprocess, sys, tempfile, time

DEFAULT_EVENTS = ",".join(["context-switches"] + [f"syscalls:sys_enter_{c}" for c in
                                                   ("futex", "epoll_wait", "read", "write", "writev", "epoll_ctl")])


def thread_times(pid):
    """Thread id → (name, user ticks, system ticks)."""
    out = {}
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            head, rest = open(t + "/stat").read().rsplit(")", 1)
        except FileNotFoundError:
            continue
        v = rest.split()
        out[t] = (head.split("(", 1)[1], int(v[11]), int(v[12]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("server")
    ap.add_argument("--rate", type=float, default=5000)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--mix", choices=["date", "author", "rename"], help="only that kind of update")
    ap.add_argument("--perf-events", default=DEFAULT_EVENTS)
    a = ap.parse_args()

    d = tempfile.mkdtemp(prefix="concord-paced-")
    os.chmod(d, 0o700)
    sock = os.path.join(d, "s.sock")
    server = subprocess.Popen([a.server, "--socket", sock, "--cache", "none", "--log-level", "error"])
    perf = None
    try:
        deadline = time.time() + 30
        while not os.path.exists(sock):
            if server.poll() is not None or time.time() > deadline:
                sys.exit("the server did not start")
            time.sleep(0.05)
        w = socket.socket(socket.AF_UNIX)
        w.connect(sock)
        wf = w.makefile("rb")
        posts, authors = 100_000, 1000
        for s in range(0, posts, 2000):
            w.sendall("".join(
                '{"op":"update","model":{"id":"Post:%d","date":%d,"title":"Post number %d","author":{"id":"Person:%d","name":"Person %d"}}}\n'
                % (i, i, i, i % authors, i % authors) for i in range(s, s + 2000)).encode())
            for _ in range(2000):
                wf.readline()

        if shutil.which("perf") and a.perf_events:
            perf = subprocess.Popen(["perf", "stat", "-x,", "-e", a.perf_events, "-p", str(server.pid)],
                                    stderr=subprocess.PIPE, text=True)
            time.sleep(0.3)
        before = thread_times(server.pid)
        rng = random.Random(1)
        kind = {"date": 0, "author": 6, "rename": 9}.get(a.mix)
        sent, t0, interval = 0, time.time(), 1 / a.rate
        while time.time() - t0 < a.seconds:
            due = int((time.time() - t0) / interval) + 1
            lines = []
            while sent < due:
                r = kind if kind is not None else rng.randrange(10)
                post = rng.randrange(posts)
                if r < 5:
                    lines.append('{"op":"update","mode":"merge","model":{"id":"Post:%d","date":%d}}\n' % (post, posts + sent))
                elif r < 8:
                    lines.append('{"op":"update","mode":"merge","model":{"id":"Post:%d","author":{"id":"Person:%d"}}}\n'
                                 % (post, rng.randrange(authors)))
                else:
                    au = rng.randrange(authors)
                    lines.append('{"op":"update","model":{"id":"Person:%d","name":"Person %d renamed %d"}}\n' % (au, au, sent))
                sent += 1
            if lines:
                w.sendall("".join(lines).encode())
            time.sleep(0.0002)
        for _ in range(sent):
            wf.readline()
        after = thread_times(server.pid)
        hz = os.sysconf("SC_CLK_TCK")
        us = 1e6 / hz / sent
        total = 0
        for t, (name, u, k) in sorted(after.items()):
            u0, k0 = before.get(t, (name, 0, 0))[1:]
            total += (u - u0) + (k - k0)
            if (u - u0) + (k - k0) > 0:
                print(f"  {name:16} user {(u - u0) * us:6.1f}  system {(k - k0) * us:6.1f} µs per update")
        print(f"sent {sent} updates at {a.rate:.0f}/s{' (' + a.mix + ' only)' if a.mix else ''}: server CPU {total * us:.1f} µs per update")
        if perf:
            perf.send_signal(signal.SIGINT)
            for line in perf.communicate()[1].splitlines():
                f = line.split(",")
                if len(f) > 2 and f[0].strip().isdigit():
                    print(f"{int(f[0]) / sent:8.2f}  {f[2]} per update")
            perf = None
    finally:
        if perf:
            perf.send_signal(signal.SIGINT)
            perf.wait()
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
