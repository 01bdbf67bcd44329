#!/usr/bin/env python3
"""Checks that no two source files call each other, directly or around a
loop, and that the core's rooms call only downward: reads the object files
of a build with nm, draws an edge from a file to each file defining a
symbol it uses, and prints every cycle (strongly connected component) and
every upward call with the symbols behind its edges. The core's room
order is the table of docs/ARCHITECTURE.md ("The rooms of the core",
bottom up): a file may call files of its own row and of rows above it in
the table, never of a row below.

usage: check_calls.py BUILD_DIR   exit 1 on a cycle or an upward call,
                                  2 on no objects

Object files whose source is no longer in the tree (left in a reused build
directory by a file that was moved or removed) are skipped.
"""
import collections
import glob
import os
import subprocess
import sys


def source_of(obj, build):
    rel = os.path.relpath(obj, build)
    top, rest = rel.split('/CMakeFiles/', 1) if '/CMakeFiles/' in rel \
        else ('.', rel.split('CMakeFiles/', 1)[1])
    src = rest.split('.dir/', 1)[1][:-2]
    src = '/'.join('..' if c == '__' else c for c in src.split('/'))
    return os.path.normpath(os.path.join(top, src)), rest.split('.dir/')[0]


def source_root(build):
    try:
        with open(os.path.join(build, 'CMakeCache.txt')) as f:
            for line in f:
                if line.startswith('CMAKE_HOME_DIRECTORY:'):
                    return line.split('=', 1)[1].strip()
    except OSError:
        pass
    return None


def source_exists(root, src):
    if root is None:
        return True
    return os.path.exists(os.path.join(root, src)) or \
        os.path.exists('/' + src)


def core_rooms(root):
    """{core/file.c: row} from docs/ARCHITECTURE.md's room table."""
    rooms = {}
    if root is None:
        return rooms
    try:
        with open(os.path.join(root, 'docs', 'ARCHITECTURE.md')) as f:
            text = f.read()
    except OSError:
        return rooms
    part = text.split('## The rooms of the core', 1)
    if len(part) < 2:
        return rooms
    row = 0
    for line in part[1].split('\n## ', 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if len(cells) < 3 or '.c' not in cells[1]:
            continue
        for name in cells[1].replace('`', '').split(','):
            name = name.strip()
            if name.endswith('.c'):
                rooms['core/' + name] = row
        row += 1
    return rooms


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build = sys.argv[1]
    objs = glob.glob(os.path.join(build, '**', 'CMakeFiles', '**', '*.o'),
                     recursive=True)
    root = source_root(build)
    defs = collections.defaultdict(set)   # symbol -> sources
    uses = collections.defaultdict(set)   # source -> symbols
    stale = 0
    for o in objs:
        src, _ = source_of(o, build)
        if not source_exists(root, src):
            stale += 1
            continue
        out = subprocess.run(['nm', o], capture_output=True,
                             text=True).stdout
        for line in out.splitlines():
            p = line.split()
            if len(p) == 2 and p[0] == 'U':
                uses[src].add(p[1])
            elif len(p) == 3 and p[1] in 'TDBRVW':
                defs[p[2]].add(src)
    edges = collections.defaultdict(dict)
    for src, syms in uses.items():
        for s in syms:
            ds = defs.get(s, set()) - {src}
            if len(ds) > 1:   # same symbol in several programs: same tree
                top = src.split('/')[0]
                ds = {d for d in ds if d.split('/')[0] == top} or ds
                if len(ds) > 1:
                    continue
            for d in ds:
                edges[src].setdefault(d, []).append(s)
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(100000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(uses):
        if v not in index:
            visit(v)
    if not objs:
        print('check_calls: no object files under ' + build)
        return 2
    rooms = core_rooms(root)
    upward = []
    for a in sorted(edges):
        for b, syms in sorted(edges[a].items()):
            if a in rooms and b in rooms and rooms[a] < rooms[b]:
                upward.append('upward call: %s (row %d) -> %s (row %d) (%s)'
                              % (a, rooms[a], b, rooms[b],
                                 ', '.join(sorted(syms)[:4])))
    unplaced = sorted(src for src in uses
                      if src.startswith('core/') and src not in rooms)
    if rooms:
        for u in unplaced:
            upward.append('%s: in no row of docs/ARCHITECTURE.md\'s room '
                          'table' % u)
    for u in upward:
        print(u)
    for comp in comps:
        print('cycle of %d files:' % len(comp))
        cs = set(comp)
        for a in comp:
            for b, syms in sorted(edges[a].items()):
                if b in cs:
                    print('  %s -> %s (%s)' % (a, b,
                                              ', '.join(sorted(syms)[:4])))
    print('check_calls: %d files, %d cycles, %d upward calls or unplaced '
          'core files (%d core files in %d rooms)%s' % (
              len(uses), len(comps), len(upward), len(rooms),
              len(set(rooms.values())),
              ' (%d stale objects skipped)' % stale if stale else ''))
    return 1 if comps or upward else 0


if __name__ == '__main__':
    sys.exit(main())
