#!/usr/bin/env python3
"""Every `Note [Title] in FILE` (or `(FILE)`) in the sources and docs names the file where
Note [Title] is defined, and every note title referred to is defined somewhere. A definition is
a comment line that is only `Note [Title]` (usually underlined with ~~~), a Markdown heading
`### Note [Title]`, or a paragraph of a comment that opens with `Note [Title]:`. Notes move with their code; this keeps the references
a newcomer follows from going stale."""
import os
import re
import subprocess
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
os.chdir(root)
files = subprocess.check_output(["git", "ls-files"], text=True).split()
files = [f for f in files if os.path.isfile(f) and not f.startswith("bench/results/")
         and f.endswith((".cpp", ".h", ".cu", ".md", ".py", ".sh", ".txt"))]

defs = {}
texts = {}
for f in files:
    text = open(f, errors="replace").read()
    texts[f] = text
    lines = text.split("\n")
    for i, line in enumerate(lines):
        own = re.match(r"\s*(?://|#+)\s*Note \[([^\]]+)\]\s*$", line)
        para = re.match(r"\s*//\s*Note \[([^\]]+)\]:", line)
        if own or (para and i > 0 and re.match(r"\s*//\s*$", lines[i - 1])):
            title = (own or para).group(1)
            if f not in defs.get(title, []):
                defs.setdefault(title, []).append(f)

ref = re.compile(r"Note \[([^\]]+)\]\s*(?:in|\()\s*`?([\w./-]+\.(?:cpp|h|cu|md|py|sh))")
bad = []
for f, text in texts.items():
    flat = re.sub(r"\n\s*(?://|#|\*)?\s*", " ", text)  # comments that wrap
    for m in ref.finditer(flat):
        title, path = re.sub(r"\s+", " ", m.group(1)), m.group(2)
        where = defs.get(title)
        if where is None:
            bad.append(f"{f}: Note [{title}] (said to be in {path}) is defined nowhere")
        elif not any(d == path or d.endswith("/" + path) for d in where):
            bad.append(f"{f}: Note [{title}] is said to be in {path}, but it is in {', '.join(where)}")
for line in bad:
    print(line)
print(f"{len(defs)} notes defined; {len(bad)} references that point elsewhere")
sys.exit(1 if bad else 0)
