#!/usr/bin/env python3
# usage: python3 scripts/hostile-durability.py   (needs .build/release/concord-server)
# Release server, SQLite, sync durability: a writer that never reads, a slow
# subscriber, a normal writer whose acks are recorded; RSS sampled; kill -9
# mid-load; restart; every acknowledged write must be there. Then SIGTERM mid-load.
import socket, json, subprocess, tempfile, time, threading, os, signal
BIN = os.environ.get("CONCORD_SERVER_BIN", ".build/release/concord-server")
d = tempfile.mkdtemp(); sock = d + "/s.sock"; db = d + "/db.sqlite"
args = [BIN, "--socket", sock, "--cache", "sqlite", "--cache-path", db, "--durability", "sync", "--log-level", "error"]
def start():
    p = subprocess.Popen(args)
    for _ in range(400):
        try:
            s = socket.socket(socket.AF_UNIX); s.connect(sock); s.close(); return p
        except Exception: time.sleep(0.02)
def conn():
    s = socket.socket(socket.AF_UNIX); s.connect(sock); return s
def rss(p): return int(open(f"/proc/{p.pid}/status").read().split("VmRSS:")[1].split()[0]) // 1024
p = start()
slow = conn(); slow.sendall(b'{"op":"subscribe","sub":"f","feed":{}}\n')
flood = conn(); stop = threading.Event()
def flooder():
    line = b'{"op":"update","model":{"id":"F:%d","body":"' + b"x" * 200 + b'"}}\n'
    i = 0
    try:
        while not stop.is_set() and i < 400_000:
            flood.sendall(b"".join(line % (i + k) for k in range(100))); i += 100
    except OSError: pass
threading.Thread(target=flooder, daemon=True).start()
acked = []
w = conn(); wf = w.makefile("rb")
def writer():
    try:
        for i in range(100_000):
            if stop.is_set(): return
            w.sendall(b'{"op":"update","model":{"id":"A:%d","n":%d}}\n' % (i, i))
            r = json.loads(wf.readline())
            if r.get("ok"): acked.append(i)
    except Exception: pass
threading.Thread(target=writer, daemon=True).start()
peak = 0
for _ in range(30):
    time.sleep(0.1); slow.recv(1024); peak = max(peak, rss(p))
os.kill(p.pid, signal.SIGKILL); p.wait(); stop.set()
n = len(acked); print(f"kill -9 after {n} acknowledged writes; peak RSS {peak} MB with a never-reading writer and a slow reader")
p = start(); c = conn(); cf = c.makefile("rb")
missing = 0
for i in acked[-2000:] + acked[:2000]:
    c.sendall(b'{"op":"get","id":"A:%d"}\n' % i); m = json.loads(cf.readline())["model"]
    if not m or m["n"] != i: missing += 1
print("acknowledged writes missing after restart (first and last 2,000 checked):", missing)
# SIGTERM mid-load: it must exit 0 promptly.
stop.clear(); flood = conn(); threading.Thread(target=flooder, daemon=True).start()
time.sleep(1); t = time.time(); p.send_signal(signal.SIGTERM); rc = p.wait(30)
print(f"SIGTERM under a flood: exit {rc} in {time.time() - t:.2f} s")
# Its database and socket directory go once it has stopped.
import shutil; shutil.rmtree(d, ignore_errors=True)
