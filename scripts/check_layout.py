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
    header anywhere else);
  - the contract block (include/pdx/README.md): every PDX_API declaration
    in include/pdx/*.h, and every op of the module tables
    (pdx_backend_ops_t, pdx_store_ops_t), has a comment right before it
    with one @param [in|out|in,out] line per parameter in order, @return
    unless it returns void, and ends with the lines "Owns:", "Blocks:" and
    "Threads:", in that order (each may continue on indented lines);
  - no issue numbers in include/pdx (they belong in docs/).

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


CONTRACT_TAIL = ('Owns:', 'Blocks:', 'Threads:')
OPS_TABLES = ('pdx_backend_ops_t', 'pdx_store_ops_t')
ISSUE_RE = re.compile(r'\bissues?\s*#?\d|(?<![\w&])#\d', re.I)


def comment_before(lines, i):
    """The /* ... */ comment that ends on the line right before lines[i]
    (declarations may not be separated from it), as a list of lines, or
    None."""
    j = i - 1
    if j < 0 or not lines[j].rstrip().endswith('*/'):
        return None
    k = j
    while k >= 0 and '/*' not in lines[k]:
        k -= 1
    if k < 0 or lines[k].strip().startswith('//'):
        return None
    return lines[k:j + 1]


def split_params(plist):
    """Names of the parameters in the text between a declaration's
    parentheses ([] for `void`; '...' for a variadic tail)."""
    parts, depth, cur = [], 0, ''
    for ch in plist:
        if ch in '([':
            depth += 1
        elif ch in ')]':
            depth -= 1
        if ch == ',' and depth == 0:
            parts.append(cur)
            cur = ''
        else:
            cur += ch
    parts.append(cur)
    names = []
    for part in parts:
        part = part.strip()
        if part in ('', 'void'):
            continue
        if part == '...':
            names.append('...')
            continue
        m = re.search(r'\(\s*\*\s*(\w+)\s*\)', part)  # function pointer
        if m is None:
            m = re.search(r'(\w+)\s*(\[[^\]]*\])*$', part)
        names.append(m.group(1) if m else '?')
    return names


def check_contract(where, comment, params, returns_void):
    """Breaches of the contract form in `comment` (lines of one comment)
    for a declaration with parameters `params`."""
    bad = []
    if comment is None:
        return ['%s: no contract comment right before it' % where]
    body = [re.sub(r'^\s*(/\*+|\*/|\*)?', '', l).rstrip() for l in comment]
    body = [re.sub(r'\*/$', '', l).rstrip() for l in body]
    # The three closing lines, in order, each starting a line, and nothing
    # after Threads: but its indented continuation.
    at = {}
    for n, l in enumerate(body):
        for key in CONTRACT_TAIL:
            if l.lstrip().startswith(key) and l.startswith(' ' + key):
                at.setdefault(key, []).append(n)
    missing = [k for k in CONTRACT_TAIL if k not in at]
    if missing:
        bad.append('%s: contract lacks %s' % (where, ', '.join(
            '"%s"' % k for k in missing)))
    elif any(len(at[k]) > 1 for k in CONTRACT_TAIL):
        bad.append('%s: a contract line appears twice' % where)
    else:
        o, b, t = (at[k][0] for k in CONTRACT_TAIL)
        if not o < b < t:
            bad.append('%s: contract lines not in the order Owns:, Blocks:, '
                       'Threads:' % where)
        else:
            for n in list(range(o + 1, b)) + list(range(b + 1, t)) + \
                    list(range(t + 1, len(body))):
                if body[n].strip() and not body[n].startswith('   '):
                    bad.append('%s: "%s" is not a continuation of the '
                               'contract lines (they end the comment)'
                               % (where, body[n].strip()))
                    break
    got = []
    for l in body:
        m = re.match(r'\s*@param\s+\[(in|out|in,out)\]\s+(\S+)', l)
        if m:
            got.append(m.group(2))
        elif re.match(r'\s*@param\b', l):
            bad.append('%s: "%s": @param wants [in], [out] or [in,out] '
                       'and a name' % (where, l.strip()))
    if got != params:
        bad.append('%s: @param names %s, the declaration %s'
                   % (where, got, params))
    has_ret = any(re.match(r'\s*@return\b', l) for l in body)
    if has_ret == returns_void:
        bad.append('%s: %s' % (where, '@return for a void function'
                               if has_ret else 'no @return'))
    return bad


def check_contracts(root):
    """The contract block of every PDX_API declaration and module op, and
    no issue numbers, in include/pdx/*.h."""
    bad = []
    inc = os.path.join(root, 'include', 'pdx')
    for f in sorted(os.listdir(inc)):
        if not f.endswith('.h'):
            continue
        rel = 'include/pdx/' + f
        with open(os.path.join(inc, f)) as fh:
            text = fh.read()
        lines = text.split('\n')
        for n, l in enumerate(lines):
            if ISSUE_RE.search(l):
                bad.append('%s:%d: an issue number in a public header '
                           '(docs/ holds the history)' % (rel, n + 1))
        for n, l in enumerate(lines):
            if not l.startswith('PDX_API'):
                continue
            decl = l
            k = n
            while ';' not in decl and k + 1 < len(lines):
                k += 1
                decl += ' ' + lines[k].strip()
            decl = decl[:decl.index(';')]
            m = re.search(r'\b(pdx_\w+)\s*\(', decl)
            if m is None:  # a variable (pdx_plugin_v1)
                m = re.search(r'(\w+)\s*$', decl)
                where = '%s:%d: %s' % (rel, n + 1, m.group(1))
                bad += check_contract(where, comment_before(lines, n), [],
                                      True)
                continue
            depth, e = 0, m.end() - 1
            for e in range(m.end() - 1, len(decl)):
                depth += {'(': 1, ')': -1}.get(decl[e], 0)
                if depth == 0:
                    break
            params = split_params(decl[m.end():e])
            ret = decl[len('PDX_API'):m.start()].replace('extern', '')
            where = '%s:%d: %s' % (rel, n + 1, m.group(1))
            bad += check_contract(where, comment_before(lines, n), params,
                                  ret.strip() == 'void')
        for table in OPS_TABLES:
            end = text.find('} %s;' % table)
            if end < 0:
                continue
            start = text.rfind('typedef struct', 0, end)
            first = text.count('\n', 0, start)
            last = text.count('\n', 0, end)
            for n in range(first, last):
                m = re.match(r'\s*(.*?)\(\s*\*\s*(\w+)\s*\)\s*\(', lines[n])
                if m is None:
                    continue
                decl, k = lines[n], n
                while ';' not in decl:
                    k += 1
                    decl += ' ' + lines[k].strip()
                plist = decl[decl.index('(', decl.index(m.group(2))) + 1:
                             decl.rindex(')')]
                where = '%s:%d: %s.%s' % (rel, n + 1, table, m.group(2))
                bad += check_contract(where, comment_before(lines, n),
                                      split_params(plist),
                                      m.group(1).strip() == 'void')
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
    bad += check_contracts(root)
    for b in bad:
        print(b)
    print('check_layout: %d breaches' % len(bad))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
