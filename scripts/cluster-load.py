#!/usr/bin/env python3
# usage: python3 scripts/cluster-load.py   (needs .build/release/concord-server and /usr/bin/redis-server)
# Cluster mode under load, everything on this machine over Unix sockets: one
# Redis (AOF, appendfsync always, then everysec), two release hosts; C writer
# connections per host, each keeping W updates in flight, N updates per
# connection. Prints mutations/s applied cluster-wide and the latency of an
# update (sent -> answered) p50/p99, next to a single server with the same load.
# Bounded: every run stops after its N updates or 60 s.
import json, os, socket, subprocess, tempfile, threading, time

BIN = os.environ.get("CONCORD_SERVER_BIN", ".build/release/concord-server")
N = int(os.environ.get("N", "4000"))


def wait_socket(path, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        try:
            s = socket.socket(socket.AF_UNIX); s.connect(path); s.close(); return True
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"nothing listens on {path}")


def writer(path, tag, inflight, n, lat, deadline):
    s = socket.socket(socket.AF_UNIX); s.connect(path); f = s.makefile("rb")
    sent = {}
    done = 0
    i = 0
    while done < n and time.time() < deadline:
        while i < n and i - done < inflight:
            sent[i] = time.perf_counter()
            s.sendall(b'{"rid":%d,"op":"update","model":{"id":"%s:%d","v":%d,"name":"Ada Lovelace","tags":["a","b"]}}\n' % (i, tag.encode(), i % 500, i))
            i += 1
        r = json.loads(f.readline())
        if "rid" in r and r.get("ok"):
            lat.append(time.perf_counter() - sent.pop(r["rid"]))
        done += 1
    s.close()


def cross(writer_path, watcher_path, rate, seconds=3.0):
    """A writer on one host at `rate` updates/s (paced, 64 in flight at most);
    a feed subscriber on another: update sent -> event received there."""
    w = socket.socket(socket.AF_UNIX); w.connect(writer_path); wf = w.makefile("rb")
    s = socket.socket(socket.AF_UNIX); s.connect(watcher_path); sf = s.makefile("rb")
    s.sendall(b'{"op":"subscribe","sub":"f","feed":{}}\n'); json.loads(sf.readline())
    lat = []
    n = int(rate * seconds)
    def watch():
        got = 0
        while got < n:
            e = json.loads(sf.readline())
            if e.get("event") == "entity":
                lat.append(time.perf_counter() - e["model"]["t"] / 1e9); got += 1
    t = threading.Thread(target=watch, daemon=True); t.start()
    acks = threading.Thread(target=lambda: [wf.readline() for _ in range(n)], daemon=True); acks.start()
    start = time.perf_counter()
    i = 0
    while i < n:
        # Paced by sleeping (a busy loop would hold the GIL from the watcher): every 2 ms, what is due.
        due = min(n, int((time.perf_counter() - start) * rate) + 1)
        while i < due:
            w.sendall(b'{"op":"update","model":{"id":"X:%d","t":%d}}\n' % (i % 100, int(time.perf_counter() * 1e9)))
            i += 1
        time.sleep(0.002)
    t.join(10); acks.join(10)
    w.close(); s.close()
    lat.sort()
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3 if lat else float("nan")
    return p(0.5), p(0.99), len(lat)


def run(sockets, conns, inflight):
    lat = []
    threads = []
    deadline = time.time() + 60
    t0 = time.perf_counter()
    for h, path in enumerate(sockets):
        for c in range(conns):
            t = threading.Thread(target=writer, args=(path, f"H{h}C{c}", inflight, N, lat, deadline))
            t.start(); threads.append(t)
    for t in threads: t.join()
    dt = time.perf_counter() - t0
    lat.sort()
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e3 if lat else float("nan")
    return len(lat) / dt, p(0.5), p(0.99)


def main():
    d = tempfile.mkdtemp()
    procs = []
    try:
        rows = []
        # A single server, the same load, for comparison.
        single = subprocess.Popen([BIN, "--socket", d + "/single.sock", "--cache", "none", "--log-level", "error"]); procs.append(single)
        wait_socket(d + "/single.sock")
        for conns, inflight in [(1, 1), (1, 64), (4, 64)]:
            rows.append(("single server", conns, inflight) + run([d + "/single.sock"], conns, inflight))
        crosses = []
        for rate in [1000, 5000]:
            crosses.append(("single server (writer and watcher on it)", rate) + cross(d + "/single.sock", d + "/single.sock", rate))
        single.terminate(); single.wait()
        for fsync in ["always", "everysec"]:
            rd = tempfile.mkdtemp(dir=d)
            redis = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", rd + "/r.sock", "--dir", rd, "--appendonly", "yes",
                                      "--appendfsync", fsync, "--save", "", "--logfile", rd + "/redis.log"]); procs.append(redis)
            wait_socket(rd + "/r.sock")
            hosts = []
            for h in range(2):
                p = subprocess.Popen([BIN, "--socket", f"{rd}/h{h}.sock", "--cluster", f"unix://{rd}/r.sock", "--cluster-name", "load",
                                      "--cluster-host", f"h{h}", "--log-level", "error"]); procs.append(p); hosts.append(f"{rd}/h{h}.sock")
            for h in hosts: wait_socket(h)
            def redis_cpu():
                info = subprocess.run(["redis-cli", "-s", rd + "/r.sock", "INFO", "cpu"], capture_output=True, text=True).stdout
                vals = dict(l.split(":", 1) for l in info.splitlines() if ":" in l)
                return float(vals["used_cpu_sys"]) + float(vals["used_cpu_user"])
            cpu0 = redis_cpu()
            for conns, inflight in [(1, 1), (1, 64), (4, 64)]:
                rows.append((f"2 hosts, appendfsync {fsync}", conns, inflight) + run(hosts, conns, inflight))
            for rate in [1000, 5000]:
                crosses.append((f"host a -> host b, appendfsync {fsync}", rate) + cross(hosts[0], hosts[1], rate))
            xlen = subprocess.run(["redis-cli", "-s", rd + "/r.sock", "XLEN", "concord:{load}:log"], capture_output=True, text=True).stdout.strip()
            cpu = redis_cpu() - cpu0
            mutations = (1 + 1 + 4) * 2 * N + 18_000  # the three throughput rows on both hosts, and the two paced cross-host rows
            rows.append((f"  (log entries: {xlen}; Redis CPU {cpu:.2f} s: {cpu / max(1, int(xlen)) * 1e6:.1f} µs per entry, {cpu / mutations * 1e6:.2f} µs per mutation, all its work: appends, two readers, heartbeats)", 0, 0, 0, 0, 0))
            for p in procs[-3:]: p.terminate()
            for p in procs[-3:]: p.wait()
        print(f"{'setup':32} {'conns/host':>10} {'in flight':>9} {'updates/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
        for name, c, w, rate, p50, p99 in rows:
            if c == 0: print(name); continue
            print(f"{name:32} {c:>10} {w:>9} {rate:>10.0f} {p50:>8.2f} {p99:>8.2f}")
        print()
        print(f"{'update -> event':42} {'rate/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'events':>7}")
        for name, rate, p50, p99, n in crosses:
            print(f"{name:42} {rate:>7} {p50:>8.2f} {p99:>8.2f} {n:>7}")
    finally:
        for p in procs:
            if p.poll() is None: p.kill(); p.wait()


main()
