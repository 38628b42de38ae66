#!/usr/bin/env python3
# Where one update's instructions go, whole server process, under callgrind
# (`make profile-update`): the same runs as `make bench-instructions` (N
# updates of the 227-byte document to a key with S key subscribers, and the
# setup alone), kept, and read back as differences per update:
#   - the total, and the update's path by phase (inclusive costs of the
#     functions that make up the path: loop thread, parse, decode, mutation
#     and its steps, render, versions, commit);
#   - the functions with the highest self cost;
#   - with --callers NAME / --callees NAME: who calls a function, or what a
#     function calls, per update (NAME: the start of a demangled name, e.g.
#     "swift_retain" or "Store.apply(").
# valgrind 3.19 cannot read the DWARF 5 of Swift 6.3 binaries: the server runs
# from a copy made with `objcopy --strip-debug` (its symbol table stays).
# With --lines FILE (a path under Sources/, e.g. ConcordJSON/JSONParser.swift)
# it builds the server again with DWARF 4 debug info (.build-dwarf4/, which
# valgrind reads), runs that copy, and also prints FILE's lines with their
# cost per update (inlined code is counted where it was inlined from, when
# the compiler kept the line; the rest is the file's "unidentified lines").
# With --alone the updates go one at a time, each after the previous answer
# (`make bench-instructions`' last row; one subscriber): what a request that
# arrives alone costs beyond the pipelined one (the loop's reads and writes,
# the hand-offs, a turn per request).
#   usage: scripts/profile-update.py [CONCORD_SERVER] [--subs 1] [-n 2000] [--top 40]
#                                    [--callers NAME] [--callees NAME] [--keep DIR]
#                                    [--lines FILE] [--alone]
# Fails (exit 1) when a run measured nothing.
import collections, importlib.util, os, re, shutil, subprocess, sys, tempfile

args = sys.argv[1:]
def opt(name, default):
    if name in args:
        i = args.index(name); v = args[i + 1]; del args[i:i + 2]; return v
    return default
SUBS = int(opt("--subs", "1"))
N = int(opt("-n", "2000"))
TOP = int(opt("--top", "40"))
CALLERS = opt("--callers", None)
CALLEES = opt("--callees", None)
KEEP = opt("--keep", None)
LINES = opt("--lines", None)
ALONE = "--alone" in args
if ALONE: args.remove("--alone")
SERVER = args[0] if args else ".build/release/concord-server"

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("ivr", os.path.join(here, "instructions-vs-redis.py"))
ivr = importlib.util.module_from_spec(spec)
saved, sys.argv = sys.argv, [sys.argv[0]]
spec.loader.exec_module(ivr)
sys.argv = saved

# The update's path, in order: (label, start of the demangled name).
PHASES = [
    ("loop thread (libuv: reads, framing, writes)", "uv_run"),
    ("  read callbacks (framing, hand-off)", "Server.read("),
    ("  deliveries taken, writes queued", "Server.deliveriesArrived("),
    ("sequencer: turns", "Sequencer.turn("),
    ("  parse the lines", "static Engine.parse("),
    ("  handle a parsed line", "Engine.handle("),
    ("    decode the request", "static Request.decode("),
    ("    dispatch", "Engine.dispatch("),
    ("    an update (single server, no backend)", "Engine.processUpdate("),
    ("      the mutation", "Engine.mutate("),
    ("        prepare the update", "Store.prepareUpdate("),
    ("        apply it to the store", "Store.apply(_:into:)"),
    ("          the entities' records", "Store.setEntity("),
    ("          the document", "Store.setDocument("),
    ("          propagation", "specialized Store.propagate("),
    ("        stored-depth check", "Engine.checkStoredDepth("),
    ("        render the events", "Engine.render(effects:"),
    ("          render jobs", "Engine.renderJob("),
    ("          enqueue to subscribers", "Engine.enqueueRender("),
    ("        version table", "Engine.recordVersions("),
    ("        commit (the previous values freed)", "Store.commit("),
    ("        answer", "Engine.respond("),
]

def annotate(path, *flags):
    r = subprocess.run(["callgrind_annotate", "--threshold=100", *flags, path], capture_output=True, text=True)
    if r.returncode != 0: sys.exit(f"callgrind_annotate failed on {path}: {r.stderr[:500]}")
    return r.stdout

def demangler(names):
    """Mangled symbol → demangled (simplified) name, through `swift demangle`."""
    names = sorted(set(names))
    out = subprocess.run(["swift", "demangle", "--simplified", "--compact"], input="\n".join(names),
                         capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}

LINE = re.compile(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\*|<|>)?\s*(.*)")

def costs(path, inclusive):
    """Function → cost (self or inclusive) from one profile."""
    d = collections.Counter()
    for line in annotate(path, *(["--inclusive=yes"] if inclusive else [])).splitlines():
        m = LINE.match(line)
        if m and not m.group(2) and ":" in m.group(3):
            d[m.group(3).split(" [")[0].split(":", 1)[-1]] += int(m.group(1).replace(",", ""))
    return d

def edges(path, tree, target):
    """Per function named by `target` (demangled prefix): its callers (tree=caller) or callees (tree=calling)."""
    out = annotate(path, f"--tree={tree}", "--inclusive=yes")
    blocks, block, current = collections.Counter(), [], None
    names = set()
    for line in out.splitlines():
        m = LINE.match(line)
        if not m or not m.group(2):
            if not line.strip(): block, current = [], None
            continue
        # Without the call count callgrind adds ("(2,001x)"): it differs between the two runs.
        kind, name = m.group(2), re.sub(r" \([\d,]+x\)$", "", m.group(3).split(" [")[0]).split(":", 1)[-1]
        names.add(name)
        cost = int(m.group(1).replace(",", ""))
        if tree == "caller":
            if kind == "<": block.append((cost, name))
            elif kind == "*": blocks.update({(name, n): c for c, n in block}); block = []
        else:
            if kind == "*": current = name
            elif kind == ">" and current: blocks[(current, name)] += cost
    dem = demangler(names)
    result = collections.Counter()
    for (fn, other), c in blocks.items():
        if dem.get(fn, fn).startswith(target): result[dem.get(other, other)] += c
    return result

def print_lines(path, name):
    """FILE's annotated lines from the run with updates, per update (the
    setup's share of a hot line is negligible at N updates)."""
    out = annotate(path, "--auto=yes", "--show-percs=no", "--context=0")
    shown, inside = 0, False
    print(f"\n{name}, per update (lines of at least 1 instruction; '=>' lines are calls):")
    for line in out.splitlines():
        if line.startswith("-- Auto-annotated source:"):
            inside = line.split(":", 1)[1].strip().endswith(name)
            continue
        if not inside: continue
        m = re.match(r"\s*([\d,]+)\s(.*)", line)
        if not m: continue
        per = int(m.group(1).replace(",", "")) / N
        if per >= 1:
            print(f"  {per:>8,.0f}  {m.group(2)[:150]}")
            shown += 1
    if not shown: print("  (no line of that file was counted: is the name a path under Sources/?)")

def main():
    d = KEEP or tempfile.mkdtemp(prefix="concord-profile.")
    os.makedirs(d, exist_ok=True)
    if LINES:
        root = os.path.dirname(here)
        subprocess.check_call(["swift", "build", "-c", "release", "--product", "concord-server", "--build-path", ".build-dwarf4",
                               "-Xswiftc", "-dwarf-version=4", "-Xcc", "-gdwarf-4"], cwd=root,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stripped = os.path.join(root, ".build-dwarf4/release/concord-server")
    else:
        stripped = d + "/concord-server.nodebug"
        subprocess.check_call(["objcopy", "--strip-debug", SERVER, stripped])
    if ALONE:
        full = ivr.run_concord_sequential(stripped, N, d, False)
        base = ivr.run_concord_sequential(stripped, 0, d, False)
        a, b = f"{d}/concord.seq.0.{N}.out", f"{d}/concord.seq.0.0.out"
    else:
        full = ivr.run_concord(stripped, SUBS, N, d)
        base = ivr.run_concord(stripped, SUBS, 0, d)
        a, b = f"{d}/concord.{SUBS}.{N}.out", f"{d}/concord.{SUBS}.0.out"
    per = (full - base) / N
    if per <= 0: sys.exit(f"measured nothing; logs in {d}")
    how = "one at a time, 1 key subscriber" if ALONE else f"{SUBS} key subscriber(s)"
    print(f"{per:,.0f} instructions per update, whole process, {how}, {N} updates\n")

    inc_a, inc_b = costs(a, True), costs(b, True)
    dem = demangler(list(inc_a))
    incl = collections.Counter()
    for k, v in inc_a.items(): incl[dem.get(k, k)] += (v - inc_b.get(k, 0)) / N
    print("the path by phase (inclusive, per update):")
    for label, prefix in PHASES:
        v = max((c for n, c in incl.items() if n.startswith(prefix)), default=None)
        print(f"  {label:<52} {'-' if v is None else f'{v:>8,.0f}'}")

    self_a, self_b = costs(a, False), costs(b, False)
    dem = demangler(list(self_a))
    own = collections.Counter()
    for k, v in self_a.items(): own[dem.get(k, k)] += (v - self_b.get(k, 0)) / N
    print(f"\nhighest self cost (per update):")
    for name, v in own.most_common(TOP): print(f"  {v:>8,.0f}  {name[:140]}")

    for what, tree in ((CALLERS, "caller"), (CALLEES, "calling")):
        if not what: continue
        ea, eb = edges(a, tree, what), edges(b, tree, what)
        print(f"\n{'callers of' if tree == 'caller' else 'called by'} {what} (inclusive, per update):")
        diff = collections.Counter({k: (v - eb.get(k, 0)) / N for k, v in ea.items()})
        for name, v in diff.most_common(TOP):
            if v >= 1: print(f"  {v:>8,.0f}  {name[:140]}")
    if LINES: print_lines(a, LINES)
    if KEEP: print(f"\nprofiles kept in {d} (callgrind_annotate {a})")
    else: shutil.rmtree(d, ignore_errors=True)

if __name__ == "__main__":
    main()
