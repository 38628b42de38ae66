#!/usr/bin/env python3
# Shared model views under a flood: 10 fast readers, 1 never-reading and 1 slow
# subscriber, all on the same tree (one shared view), plus 10 with trees of
# their own; a pipelining writer. Checks: server RSS bounded, fast readers end
# on the last value, the slow and the never-reading ones catch up to it once
# they read (coalesced), every write acknowledged.
#   usage: scripts/hostile-models.py [.build/release/concord-server]
# Exits 1 when a check fails.
import socket, json, subprocess, sys, time, threading, tempfile, os, shutil
BIN = sys.argv[1] if len(sys.argv) > 1 else ".build/release/concord-server"
d = tempfile.mkdtemp(); sock = d + "/s"
p = subprocess.Popen([BIN, "--socket", sock, "--cache", "none", "--log-level", "error"])
for _ in range(200):
    try: s = socket.socket(socket.AF_UNIX); s.connect(sock); s.close(); break
    except OSError: time.sleep(0.025)
def conn():
    s = socket.socket(socket.AF_UNIX); s.connect(sock); return s, s.makefile("rb")
tree = lambda v: {"id": "E:1", "v": v, "pad": "x" * 200, "friend": {"id": "F:1", "n": 1}}
def sub(c, name, model):
    c[0].sendall((json.dumps({"op": "subscribe", "sub": name, "model": model}) + "\n").encode()); json.loads(c[1].readline())
fast = [conn() for _ in range(10)]; own = [conn() for _ in range(10)]
never, slow = conn(), conn()
for i, c in enumerate(fast): sub(c, "m", tree(0))
for i, c in enumerate(own): sub(c, "m", {"viewer": i, "e": tree(0)})
sub(never, "m", tree(0)); sub(slow, "m", tree(0))
N = 30_000
last = {}
def reader(i, c, key):
    v = None
    while True:
        l = c[1].readline()
        if not l: break
        e = json.loads(l); m = e.get("model") or {}
        v = (m.get("e") or m).get("v", v)
        if v == N: break
    last[key] = v
ts = [threading.Thread(target=reader, args=(i, c, f"fast{i}")) for i, c in enumerate(fast)]
ts += [threading.Thread(target=reader, args=(i, c, f"own{i}")) for i, c in enumerate(own)]
for t in ts: t.start()
def slow_reader():
    # 16 KB every 50 ms (320 KB/s), whole lines only.
    v = None; buf = b""
    slow[0].settimeout(60)
    while v != N:
        time.sleep(0.05)
        try: chunk = slow[0].recv(16 << 10)
        except socket.timeout: break
        if not chunk: break
        buf += chunk
        lines = buf.split(b"\n"); buf = lines[-1]
        for l in lines[:-1]:
            e = json.loads(l); v = (e.get("model") or {}).get("v", v)
    last["slow"] = v
st = threading.Thread(target=slow_reader); st.start()
w = conn(); acks = [0]
def ackr():
    for _ in range(N):
        if json.loads(w[1].readline()).get("ok"): acks[0] += 1
at = threading.Thread(target=ackr); at.start()
peak = 0
def rss():
    with open(f"/proc/{p.pid}/status") as f:
        for l in f:
            if l.startswith("VmRSS"): return int(l.split()[1]) // 1024
t0 = time.time()
for k in range(0, N, 1000):
    w[0].sendall("".join(json.dumps({"op": "update", "model": tree(v)}) + "\n" for v in range(k + 1, k + 1001)).encode())
    peak = max(peak, rss())
at.join(); 
for t in ts: t.join(120)
peak = max(peak, rss())
# The never-reading subscriber now reads: its last event must carry the last value.
never[0].settimeout(5); v = None; buf = b""
try:
    while True:
        chunk = never[0].recv(1 << 20)
        if not chunk: break
        buf += chunk
        lines = buf.split(b"\n"); buf = lines[-1]
        for l in lines[:-1]:
            e = json.loads(l); v = (e.get("model") or {}).get("v", v)
        if v == N: break
except socket.timeout: pass
last["never"] = v
st.join(120)
print(f"acked {acks[0]} of {N} in {time.time()-t0:.1f} s; peak RSS {peak} MB")
print("final values:", {k: last.get(k) for k in ["fast0", "fast9", "own0", "own9", "slow", "never"]}, "all fast/own at N:", all(last.get(f"fast{i}") == N and last.get(f"own{i}") == N for i in range(10)))
p.terminate(); code = p.wait()
print("SIGTERM exit", code)
shutil.rmtree(d, ignore_errors=True)
ok = acks[0] == N and code == 0 and all(last.get(k) == N for k in last) and len(last) == 22
sys.exit(0 if ok else 1)
