#!/usr/bin/env python3
"""Counts the files in the largest import circle of a library crate (its src/).

A file imports another when its code (comments stripped) names a `crate::`, `super::` or
`self::` path that resolves to that file; names re-exported at the crate root (`crate::Error`)
resolve to their defining module, and lib.rs itself is left out (it only declares and
re-exports). A circle is a strongly connected component of that graph.

Usage: scripts/import_circles.py [CRATE] [--max N]  (CRATE: the folder holding src/lib.rs, `.`
for the library, `llm` for the engine; exit 1 when the largest circle has more than N files)
"""
import os, re, sys
args = [a for a in sys.argv[1:]]
limit = None
if '--max' in args:
    i = args.index('--max'); limit = int(args[i + 1]); del args[i:i + 2]
root = args[0] if args else '.'
src = os.path.join(root, 'src')
files = []
for d, _, fs in os.walk(src):
    for f in fs:
        if f.endswith('.rs'): files.append(os.path.relpath(os.path.join(d, f), src))
def modpath(f):
    p = f[:-3].split('/')
    if p[-1] in ('mod', 'lib'): p = p[:-1]
    return p
mods = {tuple(modpath(f)): f for f in files}
def strip_comments(t):
    t = re.sub(r'/\*.*?\*/', '', t, flags=re.S)
    return '\n'.join(l.split('//')[0] if not l.strip().startswith('//') else '' for l in t.split('\n'))
# root re-exports
lib = open(os.path.join(src, 'lib.rs')).read()
reexp = {}
for m in re.finditer(r'pub use (\w+)::\{([^}]*)\};', lib):
    for n in m.group(2).split(','):
        reexp[n.strip()] = m.group(1)
for m in re.finditer(r'pub use (\w+)::(\w+);', lib):
    reexp[m.group(2)] = m.group(1)
def expand(s):
    # expand a use tree like a::{b, c::{d,e}} into list of paths
    s = s.strip()
    i = s.find('{')
    if i < 0: return [s]
    prefix = s[:i]
    depth = 0; parts = []; cur = ''
    body = s[i+1:s.rfind('}')]
    for ch in body:
        if ch == '{': depth += 1
        if ch == '}': depth -= 1
        if ch == ',' and depth == 0: parts.append(cur); cur = ''
        else: cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p.strip(): out += [prefix + q for q in expand(p)]
    return out
def resolve(cur, path):
    segs = [x for x in path.split('::') if x]
    if not segs: return None
    base = list(modpath(cur))
    if cur.endswith('.rs') and not cur.endswith('mod.rs') and not cur.endswith('lib.rs'):
        selfmod = base
    else: selfmod = base
    if segs[0] == 'crate': m = []; segs = segs[1:]
    elif segs[0] == 'super': m = selfmod[:-1]; segs = segs[1:]
    elif segs[0] == 'self': m = selfmod; segs = segs[1:]
    else: return None
    while segs and segs[0] == 'super': m = m[:-1]; segs = segs[1:]
    if not m and segs and segs[0] in reexp: segs = [reexp[segs[0]]] + segs
    best = None
    full = m + segs
    for k in range(len(full), -1, -1):
        if tuple(full[:k]) in mods: best = mods[tuple(full[:k])]; break
    return best
edges = {f: set() for f in files}
for f in files:
    t = strip_comments(open(os.path.join(src, f)).read())
    paths = []
    for m in re.finditer(r'\buse\s+([^;]+);', t, flags=re.S):
        paths += expand(re.sub(r'\s+', '', m.group(1)))
    paths += re.findall(r'\b(?:crate|super)(?:::\w+)+', t)
    for p in paths:
        p = re.sub(r'\bas\w+$', '', p)
        r = resolve(f, p)
        if r and r != f and r != 'lib.rs': edges[f].add(r)
# tarjan
sys.setrecursionlimit(10000)
idx = {}; low = {}; st = []; on = set(); sccs = []; c = [0]
def sc(v):
    idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
    for w in edges[v]:
        if w not in idx: sc(w); low[v] = min(low[v], low[w])
        elif w in on: low[v] = min(low[v], idx[w])
    if low[v] == idx[v]:
        comp = []
        while True:
            w = st.pop(); on.discard(w); comp.append(w)
            if w == v: break
        sccs.append(comp)
for v in files:
    if v not in idx: sc(v)
big = sorted(sccs, key=len, reverse=True)
print('files', len(files), 'largest circle', len(big[0]))
for comp in big[:3]:
    if len(comp) > 1: print(len(comp), sorted(comp))
if limit is not None and len(big[0]) > limit:
    sys.exit(1)
