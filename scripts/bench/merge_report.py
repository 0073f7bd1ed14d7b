#!/usr/bin/env python3
"""Merges a new BENCHMARKS.md (the sections this run measured) into the previous one: a section
(a `## ` heading) this run did not measure keeps its previous text, marked with the date it was
measured; sections keep the previous order, new ones come at the end.

    merge_report.py NEW OLD > MERGED
"""
import re, sys

def split(text):
    """(head, [(heading, body)]) of a report."""
    parts = re.split(r"(?m)^(?=## )", text)
    head, sections = parts[0], []
    for p in parts[1:]:
        heading, _, body = p.partition("\n")
        # Each section ends in exactly one blank line, whatever its printer left.
        sections.append((heading, body.rstrip("\n") + "\n\n"))
    return head, sections

new_head, new = split(open(sys.argv[1]).read())
# A section that prints its heading after a blank line leaves that line in the head when it is the
# first one measured.
new_head = new_head.rstrip("\n") + "\n\n"
try:
    old_text = open(sys.argv[2]).read()
except FileNotFoundError:
    old_text = ""
old_head, old = split(old_text)
# The date an earlier section was measured: its own mark, else its report's header.
m = re.search(r"on (\d{4}-\d{2}-\d{2})", old_head)
old_date = m.group(1) if m else "an earlier run"
fresh = dict(new)
out = [new_head]
for heading, body in old:
    if heading in fresh:
        out.append(f"{heading}\n{fresh.pop(heading)}")
    else:
        mark = "" if body.lstrip().startswith("_Measured on") else f"\n_Measured on {old_date} (not re-run since)._\n"
        out.append(f"{heading}\n{mark}{body}")
for heading, body in new:
    if heading in fresh:
        out.append(f"{heading}\n{body}")
sys.stdout.write("".join(out).rstrip("\n") + "\n")
