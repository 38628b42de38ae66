#!/usr/bin/env python3
# usage: python3 scripts/hostile-cluster.py   (needs .build/release/concord-server and /usr/bin/redis-server)
# Cluster mode against hostile clients, everything on Unix sockets: Redis with
# AOF (appendfsync always), two release hosts. On host a: a writer that never
# reads (200k pipelined 200-byte updates), a slow feed reader, and a writer
# whose acknowledged writes are recorded. RSS of both hosts sampled. Then
# kill -9 of host a mid-load: every acknowledged write must be on host b;
# host a restarts and catches up. Then SIGTERM of host b under a flood: exit 0.
# Bounded: every loop stops by count and time.
import json, os, signal, socket, subprocess, tempfile, threading, time

BIN = os.environ.get("CONCORD_SERVER_BIN", ".build/release/concord-server")
d = tempfile.mkdtemp()
procs = []


def wait_socket(path, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        try:
            s = socket.socket(socket.AF_UNIX); s.connect(path); s.close(); return
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"nothing listens on {path}")


def conn(path):
    s = socket.socket(socket.AF_UNIX); s.connect(path); return s


def rss(p):
    return int(open(f"/proc/{p.pid}/status").read().split("VmRSS:")[1].split()[0]) // 1024


def host(name):
    p = subprocess.Popen([BIN, "--socket", f"{d}/{name}.sock", "--cluster", f"unix://{d}/r.sock", "--cluster-name", "hostile",
                          "--cluster-host", name, "--log-level", "error"])
    procs.append(p)
    wait_socket(f"{d}/{name}.sock")
    return p


try:
    redis = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", f"{d}/r.sock", "--dir", d, "--appendonly", "yes",
                              "--appendfsync", "always", "--save", "", "--logfile", f"{d}/redis.log"])
    procs.append(redis)
    wait_socket(f"{d}/r.sock")
    a, b = host("a"), host("b")
    slow = conn(f"{d}/a.sock"); slow.sendall(b'{"op":"subscribe","sub":"f","feed":{}}\n')
    stop = threading.Event()

    def flooder(path):
        f = conn(path)
        line = b'{"op":"update","model":{"id":"F:%d","body":"' + b"x" * 200 + b'"}}\n'
        i = 0
        try:
            while not stop.is_set() and i < 200_000:
                f.sendall(b"".join(line % (i + k) for k in range(100))); i += 100
        except OSError:
            pass

    threading.Thread(target=flooder, args=(f"{d}/a.sock",), daemon=True).start()
    acked = []
    w = conn(f"{d}/a.sock"); wf = w.makefile("rb")

    def writer():
        try:
            for i in range(100_000):
                if stop.is_set(): return
                w.sendall(b'{"op":"update","model":{"id":"A:%d","n":%d}}\n' % (i, i))
                r = json.loads(wf.readline())
                if r.get("ok"): acked.append(i)
        except Exception:
            pass

    threading.Thread(target=writer, daemon=True).start()
    peak_a = peak_b = 0
    for _ in range(40):
        time.sleep(0.1); slow.recv(1024)
        peak_a = max(peak_a, rss(a)); peak_b = max(peak_b, rss(b))
    os.kill(a.pid, signal.SIGKILL); a.wait(); stop.set()
    n = len(acked)
    print(f"host a killed -9 after {n} acknowledged writes; peak RSS a {peak_a} MB, b {peak_b} MB "
          f"(a writer that never reads and a slow feed reader on a)")
    c = conn(f"{d}/b.sock"); cf = c.makefile("rb")
    c.sendall(b'{"op":"sync"}\n'); print("host b sync:", json.loads(cf.readline()))
    missing = 0
    for i in acked:
        c.sendall(b'{"op":"get","id":"A:%d"}\n' % i); m = json.loads(cf.readline())["model"]
        if not m or m["n"] != i: missing += 1
    print(f"acknowledged writes missing on host b: {missing} of {n}")
    t = time.time(); os.unlink(f"{d}/a.sock") if os.path.exists(f"{d}/a.sock") else None
    a = host("a")
    c2 = conn(f"{d}/a.sock"); c2f = c2.makefile("rb")
    c2.sendall(b'{"op":"sync"}\n'); sa = json.loads(c2f.readline())
    c.sendall(b'{"op":"sync"}\n'); sb = json.loads(cf.readline())
    print(f"host a restarted and caught up in {time.time() - t:.1f} s: seq a {sa.get('seq')}, b {sb.get('seq')}")
    stop.clear(); threading.Thread(target=flooder, args=(f"{d}/b.sock",), daemon=True).start()
    time.sleep(1); t = time.time(); b.send_signal(signal.SIGTERM); rc = b.wait(30)
    print(f"SIGTERM of host b under a flood: exit {rc} in {time.time() - t:.2f} s")
finally:
    for p in procs:
        if p.poll() is None: p.kill(); p.wait()
