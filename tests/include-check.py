#!/usr/bin/env python3
"""The style suite's include check, in TAP.

(a) hostd's modules include each other in no circle: hostd/hostd-X.c, hostd-X.h and
    hostd-X-private.h are module X, hostd/main.c is module 'main'; X -> Y when a file of X
    includes hostd-Y.h or hostd-Y-private.h. Each circle is named by its modules.
(b) No engine or client file (common/, templates/, cloud-init/, egress/, checkpoint/, fleet/,
    vmctl/) includes a hostd header.
(c) common/ includes nothing from the other project folders.
(d) fleet/ includes nothing from the project's folders but common/.

It first runs on the fixture trees in tests/data/include-check/ and compares what it finds there
with what they hold, so a broken check cannot pass quietly. `include-check.py DIR` checks the tree
DIR alone and prints what it finds."""
import os
import re
import sys

ENGINES = ['common', 'templates', 'cloud-init', 'egress', 'checkpoint', 'fleet', 'vmctl']
FOLDERS = ENGINES + ['hostd']
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)

# What each fixture tree must make the checks find.
FIXTURES = {
    'clean': {},
    'cycle': {'cycles': ['a -> b -> c -> a']},
    'engine': {
        'hostd headers': ['checkpoint/vm-k.c includes hostd-a.h (hostd/)'],
        'common': ['common/vm-c.c includes vm-t.h (templates/)'],
    },
}


def sources(root, folder):
    """Yields (path relative to root, basenames of its quoted includes) per .c/.h file."""
    for top, _, names in sorted(os.walk(os.path.join(root, folder))):
        for name in sorted(n for n in names if n.endswith(('.c', '.h'))):
            path = os.path.join(top, name)
            with open(path, encoding='utf-8', errors='replace') as f:
                includes = [os.path.basename(i) for i in INCLUDE.findall(f.read())]
            yield os.path.relpath(path, root), includes


def module(name):
    """hostd-X.c, hostd-X.h, hostd-X-private.h: 'X'; main.c: 'main'; anything else: None."""
    m = re.fullmatch(r'hostd-(.+?)(-private)?\.[ch]', name)
    return m.group(1) if m else ('main' if name == 'main.c' else None)


def cycles(root):
    """Every elementary circle among hostd's modules, from its smallest name: 'a -> b -> a'."""
    graph = {}
    for path, includes in sources(root, 'hostd'):
        x = module(os.path.basename(path))
        if x is not None:
            targets = (module(name) for name in includes)
            graph.setdefault(x, set()).update(y for y in targets if y not in (None, x))
    found = []

    def walk(start, path):
        for y in sorted(graph.get(path[-1], ())):
            if y == start:
                found.append(' -> '.join(path + [y]))
            elif y > start and y not in path:
                walk(start, path + [y])

    for start in sorted(graph):
        walk(start, [start])
    return found


def foreign_includes(root, folders, forbidden):
    """Each include, in a file under @folders, of a header that lives in one of @forbidden."""
    owner = {}
    for folder in FOLDERS:
        for path, _ in sources(root, folder):
            owner.setdefault(os.path.basename(path), folder)
    return [f'{path} includes {name} ({owner[name]}/)'
            for folder in folders
            for path, includes in sources(root, folder)
            for name in includes if owner.get(name) in forbidden]


def check(root):
    return {
        'cycles': cycles(root),
        'hostd headers': foreign_includes(root, ENGINES, {'hostd'}),
        'common': foreign_includes(root, ['common'], set(FOLDERS) - {'common'}),
        'fleet': foreign_includes(root, ['fleet'], set(FOLDERS) - {'common', 'fleet'}),
    }


TITLES = {
    'cycles': 'no circle of includes among hostd modules',
    'hostd headers': 'no engine or client file includes a hostd header',
    'common': 'common/ includes nothing from other project folders',
    'fleet': 'fleet/ includes nothing from the project but common/',
}


def main():
    if len(sys.argv) == 2:
        found = check(sys.argv[1])
        for key, problems in found.items():
            for p in problems:
                print(f'{key}: {p}')
        return 1 if any(found.values()) else 0

    root = os.environ['VM_SOURCE_DIR']
    data = os.environ.get('VM_TEST_DATA', os.path.join(root, 'tests', 'data'))
    if not any(sources(root, 'hostd')):
        print(f'Bail out! no hostd sources under {root}')
        return 1
    n = 0
    for name, expected in FIXTURES.items():
        n += 1
        found = check(os.path.join(data, 'include-check', name))
        want = {key: expected.get(key, []) for key in found}
        ok = found == want
        print(f'{"ok" if ok else "not ok"} {n} - self-test on fixture {name!r}')
        if not ok:
            print(f'# expected {want}\n# found    {found}')
    for key, problems in check(root).items():
        n += 1
        print(f'{"not ok" if problems else "ok"} {n} - {TITLES[key]}')
        for p in problems:
            print(f'# {"cycle: " if key == "cycles" else ""}{p}')
    print(f'1..{n}')
    return 0  # the verdict is in the TAP lines: meson counts the "not ok" ones


if __name__ == '__main__':
    sys.exit(main())
