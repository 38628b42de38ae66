#!/usr/bin/env python3
# Hostile clients against a release concord-server (SQLite, sync durability, metrics, 2000 query views):
# a writer that never reads, a query subscriber that never reads, a slow query subscriber, a client
# creating distinct query definitions until refused, a pinger; peak RSS; kill -9 and SIGTERM mid-load
# with the last acknowledged writes checked after each restart.
#   usage: scripts/hostile-queries.py "$(mktemp -d)" .build/release/concord-server
import socket, json, sys, time, threading, os, subprocess, signal, urllib.request
D = sys.argv[1]; BIN = sys.argv[2]
sock = D + "/s.sock"
args = [BIN, "--socket", sock, "--cache", "sqlite", "--cache-path", D + "/c.sqlite", "--durability", "sync",
        "--metrics", "127.0.0.1:0", "--max-query-views", "2000", "--log-level", "warning"]
srv = subprocess.Popen(args, stderr=open(D + "/err", "w"))
for _ in range(100):
    try:
        s = socket.socket(socket.AF_UNIX); s.connect(sock); s.close(); break
    except Exception: time.sleep(0.05)
def conn():
    s = socket.socket(socket.AF_UNIX); s.connect(sock); return s, s.makefile("rwb")
def req(f, o):
    f.write((json.dumps(o) + "\n").encode()); f.flush()
    while True:
        l = f.readline()
        if not l: return None
        v = json.loads(l)
        if "event" not in v: return v
stop = threading.Event(); peak = [0]
def rss():
    while not stop.is_set():
        try:
            for line in open(f"/proc/{srv.pid}/status"):
                if line.startswith("VmRSS"): peak[0] = max(peak[0], int(line.split()[1]))
        except Exception: pass
        time.sleep(0.05)
threading.Thread(target=rss, daemon=True).start()
# seed data
_, w = conn()
for i in range(2000): w.write((json.dumps({"op":"update","model":{"id":"Post:%d"%i,"date":i,"a":{"id":"P:%d"%(i%50),"n":"x"}}}) + "\n").encode())
w.flush()
for i in range(2000): w.readline()
# 1. flooding writer (never reads)
def flood():
    s, f = conn()
    i = 0
    try:
        while not stop.is_set():
            s.sendall(("".join(json.dumps({"op":"update","model":{"id":"Post:%d"%((i+k)%2000),"date":i+k}})+"\n" for k in range(200))).encode())
            i += 200
    except Exception: pass
threading.Thread(target=flood, daemon=True).start()
# 2. never-reading query subscriber that keeps pinging
def noread():
    s, f = conn()
    s.sendall((json.dumps({"op":"subscribe","sub":"q","query":{"type":"Post","order":[{"path":"date","desc":True}],"limit":50}})+"\n").encode())
    try:
        while not stop.is_set():
            s.sendall(b'{"op":"ping"}\n' * 100); time.sleep(0.01)
    except Exception: pass
threading.Thread(target=noread, daemon=True).start()
# 2b. a slow query subscriber: reads 4 KB every 100 ms
slow_read = [0]
def slow():
    s, f = conn()
    s.sendall((json.dumps({"op":"subscribe","sub":"slow","query":{"type":"Post","order":[{"path":"date","desc":True}],"limit":100}})+"\n").encode())
    s.settimeout(1)
    while not stop.is_set():
        try:
            b = s.recv(4096)
            if not b: break
            slow_read[0] += len(b)
        except Exception: pass
        time.sleep(0.1)
threading.Thread(target=slow, daemon=True).start()
# 3. many distinct definitions until refused
s3, f3 = conn(); refused = None
for i in range(5000):
    r = req(f3, {"op":"subscribe","sub":"d%d"%i,"query":{"type":"Post","offset":i}})
    if not r["ok"]: refused = (i, r["error"]["code"]); break
# 4. metrics scrape + a reader measuring ping latency
port = None
for _ in range(50):
    t = open(D + "/err").read()
    if "metrics" in t: break
    time.sleep(0.1)
_, f5 = conn(); lat = []
t0 = time.time()
while time.time() - t0 < 6:
    a = time.time(); req(f5, {"op":"ping"}); lat.append((time.time() - a) * 1000)
    time.sleep(0.02)
lat.sort()
st = req(f5, {"op":"stats"})
print("refused distinct definitions at", refused)
print("ping ms p50 %.1f max %.1f" % (lat[len(lat)//2], lat[-1]))
print("stats: connections", st["connections"], "subscriptions", st["subscriptions"], "seq", st["seq"])
# kill -9 mid-load, restart, last acked value per entity stays
acked = {}
_, f6 = conn()
for i in range(50):
    r = req(f6, {"op":"update","model":{"id":"K:%d"%(i%10),"v":i}})
    if r and r.get("ok"): acked["K:%d"%(i%10)] = i
srv.send_signal(signal.SIGKILL); srv.wait(); stop.set()
print("peak RSS MB", peak[0] // 1024)
srv = subprocess.Popen(args, stderr=open(D + "/err2", "w"))
for _ in range(100):
    try:
        s = socket.socket(socket.AF_UNIX); s.connect(sock); s.close(); break
    except Exception: time.sleep(0.05)
_, f7 = conn()
lost = sum(1 for k, v in acked.items() if (req(f7, {"op":"get","id":k})["model"] or {}).get("v") != v)
q = req(f7, {"op":"get","query":{"type":"Post","limit":1}})
print("after kill -9: lost acked", lost, "of", len(acked), "; query count", q["count"])
print("slow subscriber read KB", slow_read[0] // 1024, "(not dropped:", "yes" if slow_read[0] > 0 else "no", ")")
# SIGTERM mid-load: a pipelined sync writer; every acknowledged write must survive.
acked2 = {}
s8, f8 = conn()
def writer2():
    i = 0
    try:
        while True:
            s8.sendall(("".join(json.dumps({"op":"update","rid":i+k,"model":{"id":"T:%d"%((i+k)%20),"v":i+k}})+"\n" for k in range(50))).encode())
            i += 50
    except Exception: pass
def acker():
    while True:
        # SIGTERM closes the connection while the writer still sends, so the
        # end may come as a reset: what was read before it is what was acknowledged.
        try:
            l = f8.readline()
        except OSError:
            return
        if not l: return
        v = json.loads(l)
        if v.get("ok") and isinstance(v.get("rid"), int):
            k = "T:%d" % (v["rid"] % 20); acked2[k] = max(acked2.get(k, -1), v["rid"])
threading.Thread(target=writer2, daemon=True).start()
ta = threading.Thread(target=acker, daemon=True); ta.start()
time.sleep(1.5)
srv.send_signal(signal.SIGTERM); print("SIGTERM mid-load exit", srv.wait())
ta.join(5)
srv = subprocess.Popen(args, stderr=open(D + "/err3", "w"))
for _ in range(100):
    try:
        s = socket.socket(socket.AF_UNIX); s.connect(sock); s.close(); break
    except Exception: time.sleep(0.05)
_, f9 = conn()
lost2 = sum(1 for k, v in acked2.items() if ((req(f9, {"op":"get","id":k})["model"] or {}).get("v", -1)) < v)
print("after SIGTERM: acked writes", sum(1 for _ in acked2), "entities; lost", lost2)
srv.send_signal(signal.SIGTERM); print("final SIGTERM exit", srv.wait())
