#!/usr/bin/env python3
"""Regenerates docs/configuration.md's key table and environment tables from the key table, as
test_config prints them (PSFLEET_PRINT_KEYS=1). Usage: docs/gen-configuration.py [SOURCE_DIR [BUILD_DIR]]"""
import os, subprocess, sys
root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
build = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "build")
if not os.path.isabs(build):
    build = os.path.join(root, build)
out = subprocess.run([os.path.join(build, "tests", "test_config")],
                     env=dict(os.environ, PSFLEET_PRINT_KEYS="1", PSFLEET_SOURCE_DIR=root),
                     capture_output=True, text=True).stdout
keys = out[out.index("KEYS\n") + 5:out.index("ENV\n")]
env = out[out.index("ENV\n") + 4:out.index("END\n")]
path = os.path.join(root, "docs", "configuration.md")
doc = open(path).read().split("\n")


def replace(doc, new):
    """Replaces the tables starting at new's first header line, as many as new holds (blank-separated)."""
    lines = new.rstrip("\n").split("\n")
    tables = 1 + sum(1 for i, l in enumerate(lines) if l == "" and i + 1 < len(lines) and lines[i + 1].startswith("|"))
    i = doc.index(lines[0])
    j = i
    for t in range(tables):
        while j < len(doc) and doc[j].startswith("|"):
            j += 1
        if t + 1 < tables:
            if j + 1 < len(doc) and doc[j] == "" and doc[j + 1].startswith("|"):
                j += 1
            else:
                break
    return doc[:i] + lines + doc[j:]


doc = replace(doc, keys)
doc = replace(doc, env)
open(path, "w").write("\n".join(doc))
