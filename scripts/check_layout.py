#!/usr/bin/env python3
"""Checks the tree's layout rules (docs/ARCHITECTURE.md, "How it is
checked"); run from anywhere, exits 1 on a breach, printing each:

  - no function of library code (core/, connector/, lib/, common/,
    backends/, stores/, python/src/), of the tools (tools/) or of the
    example (examples/) over 150 lines;
  - no source file over 1,200 lines unless its opening comment says why
    ("Over 1,200 lines: ...");
  - one clock: CLOCK_MONOTONIC is read in common/pdx_clock.h only (a
    timespec for a timed wait is not a clock);
  - the connector includes no core header but call_int.h; modules (backends/,
    stores/) include no core or connector header; tools and the example
    include nothing of tests/ or examples/ (what they share is support/),
    and their CMakeLists (and support/'s) link no library that tests/
    defines nor name a source folder of tests/ (the tools' nor one of
    examples/);
  - every header under include/pdx is the one public tree (no pdx/
    header anywhere else).

usage: check_layout.py [ROOT]"""
import os
import re
import sys

LIB_DIRS = ('core', 'connector', 'lib', 'common', 'backends', 'stores',
            'python/src')
FN_DIRS = LIB_DIRS + ('tools', 'examples')
FN_MAX = 150
FILE_MAX = 1200


def sources(root, dirs, exts=('.c', '.h')):
    for d in dirs:
        for base, _, files in os.walk(os.path.join(root, d)):
            for f in sorted(files):
                if f.endswith(exts):
                    yield os.path.relpath(os.path.join(base, f), root)


def functions(text):
    """(name, first line, length) of each function definition: Linux brace
    style, the body opening with '{' and closing with '}' at column 0."""
    lines = text.split('\n')
    out = []
    i = 0
    while i < len(lines):
        if lines[i] == '{':
            j = i - 1
            while j > 0 and lines[j] and not lines[j][0].isspace() and \
                    '(' not in lines[j]:
                j -= 1
            while j > 0 and lines[j - 1] and lines[j - 1][0].isspace() is \
                    False and lines[j].startswith((' ', '\t')):
                j -= 1
            k = j
            while k > 0 and lines[k].startswith((' ', '\t')):
                k -= 1
            m = re.search(r'(\w+)\s*\(', lines[k])
            end = i
            while end < len(lines) and lines[end] != '}':
                end += 1
            out.append((m.group(1) if m else '?', k + 1, end - k + 1))
            i = end
        i += 1
    return out


def cmake_files(root, dirs):
    for d in dirs:
        for base, _, files in os.walk(os.path.join(root, d)):
            if 'CMakeLists.txt' in files:
                yield os.path.relpath(os.path.join(base, 'CMakeLists.txt'),
                                      root)


def build_breaches(root):
    """Tools, the example and support/ build on libpdx and support/ only:
    their CMakeLists link no library defined under tests/ and name no
    source folder of tests/ (the tools' none of examples/ either). Starting
    the example's binary at run time ($<TARGET_FILE:...>) is no such
    dependency."""
    test_libs = set()
    for f in cmake_files(root, ('tests',)):
        with open(os.path.join(root, f)) as fh:
            test_libs.update(re.findall(r'add_library\(\s*([\w.+-]+)',
                                        fh.read()))
    bad = []
    for f in cmake_files(root, ('tools', 'examples', 'support')):
        with open(os.path.join(root, f)) as fh:
            text = re.sub(r'#[^\n]*', '', fh.read())
        for m in re.finditer(r'target_link_libraries\(([^)]*)\)', text):
            for lib in sorted(set(m.group(1).split()) & test_libs):
                bad.append('%s: links %s, a library of tests/' % (f, lib))
        folders = ('tests', 'examples') if f.startswith('tools/') else \
            ('tests',)
        for m in re.finditer(r'_SOURCE_DIR\}/(%s)\b' % '|'.join(folders),
                             text):
            bad.append('%s: names ${..._SOURCE_DIR}/%s/ (tools, the example '
                       'and support/ build on libpdx and support/ only)'
                       % (f, m.group(1)))
        for m in re.finditer(r'(?:add_subdirectory|include_directories)'
                             r'\([^)]*\.\./', text):
            bad.append('%s: reaches outside its folder with ../' % f)
    return bad


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), '..'))
    bad = []
    for f in sources(root, FN_DIRS, ('.c',)):
        with open(os.path.join(root, f)) as fh:
            text = fh.read()
        for name, line, n in functions(text):
            if n > FN_MAX:
                bad.append('%s:%d: %s is %d lines (library code, tools and '
                           'the example: at most %d)'
                           % (f, line, name, n, FN_MAX))
    bad += build_breaches(root)
    alldirs = LIB_DIRS + ('tools', 'tests', 'examples', 'support',
                          'include')
    for f in sources(root, alldirs):
        with open(os.path.join(root, f)) as fh:
            text = fh.read()
        n = text.count('\n')
        if n > FILE_MAX and 'Over 1,200 lines:' not in text[:2000]:
            bad.append('%s: %d lines, over %d without a reason at its top '
                       '("Over 1,200 lines: ...")' % (f, n, FILE_MAX))
        if f != 'common/pdx_clock.h':
            for m in re.finditer(r'clock_gettime\(CLOCK_MONOTONIC', text):
                line = text.count('\n', 0, m.start()) + 1
                bad.append('%s:%d: a clock of its own (use pdx_clock.h)'
                           % (f, line))
        incs = re.findall(r'^#include\s+"([^"]+)"', text, re.M)
        top = f.split('/')[0]
        if top == 'connector':
            for h in incs:
                if os.path.exists(os.path.join(root, 'core', h)) and \
                        h != 'call_int.h':
                    bad.append('%s: includes core/%s (the connector may '
                               'include core/call_int.h only)' % (f, h))
        if top in ('backends', 'stores'):
            for h in incs:
                if os.path.exists(os.path.join(root, 'core', h)) or \
                        os.path.exists(os.path.join(root, 'connector/src', h)):
                    bad.append('%s: includes %s of libpdx.so (modules see '
                               'pdx/backend.h or pdx/store.h)' % (f, h))
        if top in ('tools', 'examples', 'support'):
            for h in incs:
                if h.startswith(('../', 'tests/', 'examples/')):
                    bad.append('%s: includes %s (tools, the example and '
                               'support/ share through support/ only)'
                               % (f, h))
    for base, dirs, files in os.walk(root):
        rel = os.path.relpath(base, root)
        if rel.startswith(('.git', 'build')) or rel.split('/')[0] in (
                'include',) or '/build' in rel:
            continue
        if os.path.basename(base) == 'pdx' and any(
                x.endswith('.h') for x in files):
            bad.append('%s: a pdx/ header folder outside include/pdx '
                       '(one public tree)' % rel)
    for b in bad:
        print(b)
    print('check_layout: %d breaches' % len(bad))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
