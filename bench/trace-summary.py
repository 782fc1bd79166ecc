#!/usr/bin/env python3
"""Medians of the phases in hostd --debug trace lines.

Usage: trace-summary.py LABEL PATTERN [LAST] < hostd.log
Reads the "trace: WHAT: PHASE N.NN ms, ...; total N.NN ms" lines whose text matches the regular
expression PATTERN, keeps the last LAST of them (all when absent), and prints one line: LABEL,
then the median milliseconds of each phase in the order they first appeared, and of the total.
Prints nothing when no line matches.
"""
import re
import statistics
import sys

label, pattern = sys.argv[1], re.compile(sys.argv[2])
last = int(sys.argv[3]) if len(sys.argv) > 3 else 0
lines = [l for l in sys.stdin if "trace: " in l and pattern.search(l)]
if last:
    lines = lines[-last:]
phases = {}
for line in lines:
    text = line.split("trace: ", 1)[1].split(": ", 1)[-1]
    for name, ms in re.findall(r"([a-z][a-z ]*?) ([0-9.]+) ms", text):
        phases.setdefault(name.strip(), []).append(float(ms))
if phases:
    print("%s (median ms of %d): " % (label, len(lines)) +
          ", ".join("%s %.2f" % (k, statistics.median(v)) for k, v in phases.items()))
