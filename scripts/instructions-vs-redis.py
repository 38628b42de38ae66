#!/usr/bin/env python3
# Instructions per update, whole process, Concord next to Redis (issue 19's
# yardstick; `make bench-instructions`). Each server runs under callgrind
# twice: once with the setup only (S subscribers), once with the setup and
# N updates of one 227-byte JSON document (Concord: `update` to a key with S
# key subscribers; Redis: PUBLISH to a channel with S subscribers). Every
# thread, user space; (I_N - I_0) / N is one update with its S deliveries.
# valgrind 3.19 cannot read the DWARF 5 of Swift 6.3 binaries: the server is
# run from a copy made with `objcopy --strip-debug`.
# A last row sends the updates one at a time (each after the previous
# answer) to both, with one subscriber: the hand-off path's cost.
#   usage: scripts/instructions-vs-redis.py CONCORD_SERVER [REDIS_SERVER] [--subs 1,10,100] [-n 2000]
# Fails (exit 1) when a run measured nothing.
import json, os, re, shutil, signal, socket, subprocess, sys, tempfile, threading, time

args = [a for a in sys.argv[1:]]
def opt(name, default):
    if name in args:
        i = args.index(name); v = args[i + 1]; del args[i:i + 2]; return v
    return default
SUBS = [int(x) for x in opt("--subs", "1,10,100").split(",")]
N = int(opt("-n", "2000"))
CONDITIONAL = "--conditional" in args
if CONDITIONAL: args.remove("--conditional")
CONCORD = args[0] if args else ".build/release/concord-server"
REDIS = args[1] if len(args) > 1 else "/usr/bin/redis-server"

def document(i):
    # 227 bytes whatever i (the counter is padded), a change every time.
    body = {"id": "Doc:1", "title": "A document of about two hundred bytes", "n": f"{i:08d}",
            "author": {"id": "Person:1", "name": "Ann"}, "tags": ["a", "b", "c"], "body": "x" * 40}
    return json.dumps(body, separators=(",", ":"))

def wait_socket(path, proc, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None: raise SystemExit(f"server exited: {proc.returncode}")
        try:
            s = socket.socket(socket.AF_UNIX); s.connect(path); return s
        except OSError: time.sleep(0.1)
    raise SystemExit("server did not start under valgrind")

def callgrind(cmd, out):
    return subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
                            stdout=subprocess.DEVNULL, stderr=open(out + ".log", "w"))

def total(out):
    with open(out) as f:
        for line in f:
            m = re.match(r"(summary|totals): (\d+)", line)
            if m: return int(m.group(2))
    raise SystemExit(f"no total in {out} (see {out}.log)")

class Reader(threading.Thread):
    """Reads a socket until `want` lines (or bytes patterns) arrived."""
    def __init__(self, s, marker, want):
        super().__init__(daemon=True); self.s, self.marker, self.want, self.seen = s, marker, want, 0
        self.done = threading.Event()
    def run(self):
        buf = b""
        while self.seen < self.want:
            d = self.s.recv(1 << 16)
            if not d: break
            self.seen += d.count(self.marker)
        self.done.set()

def run_concord(binary, subs, n, d):
    sock = d + "/c.sock"; out = f"{d}/concord.{subs}.{n}.out"
    # Under valgrind everything runs ~50x slower: a turn budget of 100 ms
    # there is about the default 2 ms natively, so turns end where they would.
    p = callgrind([binary, "--socket", sock, "--cache", "none", "--log-level", "error", "--turn-ms", "100"], out)
    w = wait_socket(sock, p)
    readers = []
    for i in range(subs):
        s = socket.socket(socket.AF_UNIX); s.connect(sock)
        s.sendall(b'{"op":"subscribe","sub":"s","key":"k"}\n')
        f = s.makefile("rb"); f.readline()
        r = Reader(s, b'"event":"update"', n); readers.append(r)
    wf = w.makefile("rb")
    w.sendall(('{"op":"update","key":"k","model":' + document(-1) + '}\n').encode()); wf.readline()
    for r in readers: r.want = n + 1; r.start()
    for start in range(0, n, 100):
        batch = "".join('{"op":"update","key":"k","model":' + document(i) + '}\n' for i in range(start, min(n, start + 100)))
        w.sendall(batch.encode())
        for _ in range(min(n, start + 100) - start): wf.readline()
    for r in readers: r.done.wait(600)
    p.send_signal(signal.SIGTERM); p.wait(600)
    return total(out)

def run_concord_sequential(binary, n, d, conditional):
    """N updates one at a time (each after the previous answer), to one key
    with one subscriber; with `conditional`, each says if_unchanged_since
    the previous answer's seq (so none conflicts)."""
    sock = d + "/s.sock"; out = f"{d}/concord.seq.{int(conditional)}.{n}.out"
    p = callgrind([binary, "--socket", sock, "--cache", "none", "--log-level", "error", "--turn-ms", "100"], out)
    w = wait_socket(sock, p)
    s = socket.socket(socket.AF_UNIX); s.connect(sock)
    s.sendall(b'{"op":"subscribe","sub":"s","key":"k"}\n'); s.makefile("rb").readline()
    r = Reader(s, b'"event":"update"', n + 1); r.start()
    wf = w.makefile("rb")
    w.sendall(('{"op":"update","key":"k","model":' + document(-1) + '}\n').encode())
    seq = json.loads(wf.readline())["seq"]
    for i in range(n):
        cond = f',"if_unchanged_since":{seq}' if conditional else ""
        w.sendall(('{"op":"update","key":"k"' + cond + ',"model":' + document(i) + '}\n').encode())
        a = json.loads(wf.readline())
        if not a.get("ok"): raise SystemExit(f"update refused: {a}")
        seq = a["seq"]
    r.done.wait(600)
    p.send_signal(signal.SIGTERM); p.wait(600)
    return total(out)

def run_redis(binary, subs, n, d):
    sock = d + "/r.sock"; out = f"{d}/redis.{subs}.{n}.out"
    p = callgrind([binary, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no", "--dir", d,
                   "--client-output-buffer-limit", "pubsub 0 0 0"], out)
    w = wait_socket(sock, p)
    readers = []
    for i in range(subs):
        s = socket.socket(socket.AF_UNIX); s.connect(sock)
        s.sendall(b"SUBSCRIBE ch\r\n")
        got = b""
        while got.count(b"\r\n") < 6: got += s.recv(4096)
        r = Reader(s, b"$7\r\nmessage\r\n", n); readers.append(r); r.start()
    wf = w.makefile("rb")
    for start in range(0, n, 100):
        batch = b""
        for i in range(start, min(n, start + 100)):
            m = document(i).encode()
            batch += b"*3\r\n$7\r\nPUBLISH\r\n$2\r\nch\r\n$%d\r\n%s\r\n" % (len(m), m)
        w.sendall(batch)
        for _ in range(min(n, start + 100) - start): wf.readline()
    for r in readers: r.done.wait(600)
    p.send_signal(signal.SIGTERM); p.wait(600)
    return total(out)

def run_redis_sequential(binary, n, d):
    """N PUBLISHes one at a time (each after the previous reply), one subscriber."""
    sock = d + "/rs.sock"; out = f"{d}/redis.seq.{n}.out"
    p = callgrind([binary, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no", "--dir", d,
                   "--client-output-buffer-limit", "pubsub 0 0 0"], out)
    w = wait_socket(sock, p)
    s = socket.socket(socket.AF_UNIX); s.connect(sock)
    s.sendall(b"SUBSCRIBE ch\r\n")
    got = b""
    while got.count(b"\r\n") < 6: got += s.recv(4096)
    r = Reader(s, b"$7\r\nmessage\r\n", n); r.start()
    wf = w.makefile("rb")
    for i in range(n):
        m = document(i).encode()
        w.sendall(b"*3\r\n$7\r\nPUBLISH\r\n$2\r\nch\r\n$%d\r\n%s\r\n" % (len(m), m))
        wf.readline()
    r.done.wait(600)
    p.send_signal(signal.SIGTERM); p.wait(600)
    return total(out)

def main():
    d = tempfile.mkdtemp(prefix="concord-instr.")
    stripped = d + "/concord-server.nodebug"
    subprocess.check_call(["objcopy", "--strip-debug", CONCORD, stripped])
    if CONDITIONAL:
        n = 300
        plain = (run_concord_sequential(stripped, n, d, False) - run_concord_sequential(stripped, 0, d, False)) / n
        cond = (run_concord_sequential(stripped, n, d, True) - run_concord_sequential(stripped, 0, d, True)) / n
        if plain <= 0 or cond <= 0: sys.exit(f"measured nothing; logs in {d}")
        print(f"one update at a time, 1 key subscriber: plain {plain:,.0f}, with if_unchanged_since {cond:,.0f} instructions ({cond - plain:+,.0f})")
        shutil.rmtree(d, ignore_errors=True)
        return
    print(f"{'subscribers':>17} | {'Concord instr/update':>20} | {'Redis instr/PUBLISH':>19} | ratio")
    failed = False
    for s in SUBS:
        n = N if s < 100 else max(200, N // 5)
        c = (run_concord(stripped, s, n, d) - run_concord(stripped, s, 0, d)) / n
        r = (run_redis(REDIS, s, n, d) - run_redis(REDIS, s, 0, d)) / n
        if c <= 0 or r <= 0:
            print(f"{s:>17} | measured nothing (concord {c:.0f}, redis {r:.0f}); logs in {d}"); failed = True; continue
        print(f"{s:>17} | {c:>20,.0f} | {r:>19,.0f} | {c / r:.2f}x", flush=True)
    # One update at a time (each after the previous answer), one subscriber:
    # what a client that waits for its answers costs, hand-offs included.
    n = max(200, N // 2)
    c = (run_concord_sequential(stripped, n, d, False) - run_concord_sequential(stripped, 0, d, False)) / n
    r = (run_redis_sequential(REDIS, n, d) - run_redis_sequential(REDIS, 0, d)) / n
    if c <= 0 or r <= 0:
        print(f"{'1, one at a time':>17} | measured nothing (concord {c:.0f}, redis {r:.0f}); logs in {d}"); failed = True
    else:
        print(f"{'1, one at a time':>17} | {c:>20,.0f} | {r:>19,.0f} | {c / r:.2f}x", flush=True)
    if failed: sys.exit(1)
    # Measured: the profiles (~30 MB) go; a failed run keeps them for its logs.
    shutil.rmtree(d, ignore_errors=True)

if __name__ == "__main__":
    main()
