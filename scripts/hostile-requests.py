#!/usr/bin/env python3
# Single hostile requests and clients against a release concord-server, each
# with a bystander connection pinging every 5 ms: how long the request takes
# and the worst ping the bystander saw meanwhile (PROTOCOL-legal requests of
# extreme size or shape; issue "no request and no client can stall the server").
#   usage: scripts/hostile-requests.py [.build/release/concord-server] [--quick]
# Prints one line per case; `make bench` copies them into its table.
import socket, json, sys, time, threading, os, shutil, subprocess, tempfile

BIN = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else ".build/release/concord-server"
QUICK = "--quick" in sys.argv

def start(extra=()):
    d = tempfile.mkdtemp(prefix="concord-hostile.")
    sock = d + "/s.sock"
    p = subprocess.Popen([BIN, "--socket", sock, "--cache", "none", "--log-level", "error", *extra], stderr=open(d + "/err", "w"))
    for _ in range(200):
        try:
            s = socket.socket(socket.AF_UNIX); s.connect(sock); s.close(); return p, sock
        except Exception: time.sleep(0.025)
    raise SystemExit("server did not start")

class Conn:
    def __init__(self, sock):
        self.s = socket.socket(socket.AF_UNIX); self.s.connect(sock); self.f = self.s.makefile("rb")
        self.events = []
    def send(self, o): self.s.sendall((json.dumps(o, separators=(",", ":")) + "\n").encode())
    def response(self):
        while True:
            l = self.f.readline()
            if not l: return None
            v = json.loads(l)
            if "event" in v: self.events.append(v)
            else: return v
    def req(self, o): self.send(o); return self.response()

class Bystander:
    """Pings every 5 ms on its own connection, in a process of its own (so
    this script's JSON encoding cannot delay it), and reports each round trip."""
    def __init__(self, sock):
        self.p = subprocess.Popen([sys.executable, __file__, "--bystander", sock], stdout=subprocess.PIPE, text=True)
        self.times = []
        self.t = threading.Thread(target=self.collect, daemon=True); self.t.start()
    def collect(self):
        for line in self.p.stdout: self.times.append(float(line))
    def reset(self): self.times = []
    def worst(self): return max(self.times) * 1000 if self.times else 0.0
    def end(self): self.p.terminate(); self.p.wait()

def bystander_main(sock):
    c = Conn(sock)
    while True:
        t = time.perf_counter(); c.req({"op": "ping"})
        print(time.perf_counter() - t, flush=True)
        time.sleep(0.005)

def case(name, fn, by):
    by.reset(); time.sleep(0.05)
    t = time.perf_counter(); detail = fn(); el = (time.perf_counter() - t) * 1000
    time.sleep(0.05)
    print(f"{name}: {el:.0f} ms; bystander worst ping {by.worst():.1f} ms; {detail}", flush=True)
    return el, by.worst()

def main():
    p, sock = start(["--max-query-entities", "4000000"])
    by = Bystander(sock)
    w = Conn(sock)
    posts = 1000
    for i in range(posts): w.send({"op": "update", "model": {"id": f"Post:{i}", "date": i, "author": {"id": f"Person:{i % 50}", "name": "n"}}})
    for i in range(posts): w.response()
    c = Conn(sock)
    def inlist(n, op="get"):
        line = (json.dumps({"op": "get", "query": {"type": "Post", "where": {"path": "date", "in": list(range(n))}, "limit": 5}}) + "\n").encode()
        def run():
            c.s.sendall(line); r = c.response()
            return "ok, count %s" % r.get("count") if r.get("ok") else "refused: " + r["error"]["code"]
        return run
    case("in list of 80,000 values (get)", inlist(80_000), by)
    case("in list of 100,000 values (get, the most allowed)", inlist(100_000), by)
    case("in list of 1,000,000 values (7 MB line)", inlist(1_000_000), by)
    anyline = (json.dumps({"op": "get", "query": {"type": "Post", "where": {"any": [{"path": "date", "eq": i} for i in range(80_000)]}, "limit": 5}}) + "\n").encode()
    def anyeq():
        c.s.sendall(anyline); r = c.response()
        return "ok, count %s" % r.get("count") if r.get("ok") else "refused: " + r["error"]["code"]
    case("any of 80,000 eq conditions", anyeq, by)
    def orderkeys():
        r = c.req({"op": "subscribe", "sub": "ok8000", "query": {"type": "Post", "order": [{"path": f"k{i}"} for i in range(8000)]}})
        return "ok" if r.get("ok") else "refused: " + r["error"]["code"]
    case("8,000 order keys", orderkeys, by)
    # Model views that share a root: a subscribe compares its tree with at
    # most 8 listed ones, within a bounded number of values (the trees
    # below differ only at their end; equal small ones share one view).
    m = Conn(sock)
    ntree = 10_000 if QUICK else 100_000
    def near_copies():
        bad = 0
        for i in range(12):
            r = m.req({"op": "subscribe", "sub": f"near{i}", "model": {"id": "Post:1", "list": list(range(ntree)) + [i]}})
            bad += 0 if r.get("ok") else 1
        return f"12 subscribes, {bad} refused"
    case(f"subscribe 12 model trees of {ntree:,} values, alike but for their end", near_copies, by)
    nshared = 200 if QUICK else 1000
    case(f"subscribe {nshared:,} equal model trees of 1,000 values (pipelined)",
         build_on(m, nshared, None, lambda i: {"op": "subscribe", "sub": f"eq{i}", "model": {"id": "Post:2", "list": list(range(1000))}}), by)
    # Many views on one connection, then close it.
    nviews = 4000 if QUICK else 40_000
    v = Conn(sock)
    case(f"subscribe {nviews:,} distinct views on an empty type (pipelined)", build_on(v, nviews, lambda i: {"type": "Empty", "where": {"path": "n", "eq": i}}), by)
    watcher = Conn(sock)
    def close(conn):
        def run():
            # shutdown first: the makefile() reader keeps the descriptor open.
            conn.s.shutdown(socket.SHUT_RDWR); conn.f.close(); conn.s.close()
            # Until the views are dropped and unfiled from every index.
            while True:
                q = watcher.req({"op": "stats"})["queries"]
                if q["views"] == 0 and q["unfiling"] == 0: return "dropped and unfiled"
                time.sleep(0.002)
        return run
    case(f"close a connection holding {nviews:,} views", close(v), by)
    big = 400 if QUICK else 2000
    v2 = Conn(sock)
    case(f"subscribe {big:,} views of all {posts:,} posts each (pipelined)", build_on(v2, big, lambda i: {"type": "Post", "where": {"path": "date", "gte": -1 - i}}), by)
    case(f"close a connection holding {big:,} views x {posts:,} members", close(v2), by)
    # A pipelined writer while 1,000 range-predicate views watch the type.
    nq = 200 if QUICK else 1000
    r = Conn(sock)
    build_on(r, nq, lambda i: {"type": "Post", "where": {"all": [{"path": "date", "gte": i}, {"path": "date", "lt": i + 50}]}, "order": [{"path": "date"}], "limit": 10})()
    nw = 1000 if QUICK else 5000
    def pipelined():
        data = "".join(json.dumps({"op": "update", "model": {"id": f"Post:{i % posts}", "date": (i * 7) % posts}}) + "\n" for i in range(nw)).encode()
        t = threading.Thread(target=lambda: w.s.sendall(data), daemon=True); t.start()
        for _ in range(nw): w.response()
        t.join()
        return f"{nw} updates"
    case(f"pipelined updates under {nq:,} range-predicate views", pipelined, by)
    by.end(); p.terminate(); p.wait()
    # The socket's directory (its log only, after a clean stop) goes too.
    shutil.rmtree(os.path.dirname(sock), ignore_errors=True)

def build_on(conn, n, q, request=None):
    # Written from a thread while the responses are read: a client that
    # writes without reading is (rightly) flow-controlled.
    request = request or (lambda i: {"op": "subscribe", "sub": f"v{i}", "query": q(i)})
    data = "".join(json.dumps(request(i), separators=(",", ":")) + "\n" for i in range(n)).encode()
    def run():
        t = threading.Thread(target=lambda: conn.s.sendall(data), daemon=True); t.start()
        bad = sum(1 for _ in range(n) if not conn.response().get("ok"))
        t.join()
        return f"{n} subscribes, {bad} refused"
    return run

if len(sys.argv) > 2 and sys.argv[1] == "--bystander":
    bystander_main(sys.argv[2])
else:
    main()
