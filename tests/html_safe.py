#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check that a `cuheap html` page keeps a trace's text as text, whatever it holds.

A label, a frame or a command line that reached the page as markup would change the page:
"</script" ends the script element early, "<!--" followed by "<script" keeps its end tag from
ending it (the page's code is then swallowed and the charts stay empty), "<img ...>" in a table
adds an element. This script reads the trace the page was made from and the page, standard
library only, and checks that:

- the page has its own two script elements and nothing else that opens one, and no comment;
- the JSON the charts draw from holds no '<', '>', '&', U+2028 or U+2029 as such, and parses
  back to the trace's own text (every mark label, the device name, the frames);
- the HTML outside the scripts has only the page's own elements, and its text, entities
  decoded, shows the trace's command, path and call sites as they were.

    html_safe.py TRACE.jsonl PAGE.html

Prints "html safe: ok" or the first violation (exit 1).
"""
import html.parser
import json
import re
import sys

PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "b",
             "noscript", "div", "table", "tr", "th", "td", "details", "summary", "pre", "script"}


def fail(msg):
    print(f"html safe: {msg}", file=sys.stderr)
    sys.exit(1)


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.text, self.scripts, self.comments = set(), [], [], 0
        self.in_script = None

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "script":
            self.in_script = []

    def handle_endtag(self, tag):
        if tag == "script" and self.in_script is not None:
            self.scripts.append("".join(self.in_script))
            self.in_script = None

    def handle_data(self, data):
        (self.in_script if self.in_script is not None else self.text).append(data)

    def handle_comment(self, data):
        self.comments += 1


def main():
    if len(sys.argv) != 3:
        fail("usage: html_safe.py TRACE.jsonl PAGE.html")
    lines = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
    header = lines[0]
    labels = [l["label"] for l in lines if l.get("event") == "mark" and l["label"] != "nvtx pop"]
    devices = [l["name"] for l in lines if l["type"] == "device"]
    functions = [f["function"] for l in lines if l["type"] == "stack"
                 for f in l.get("frames", []) + l.get("python", []) if f.get("function")]
    page = open(sys.argv[2], encoding="utf-8").read()

    low = page.lower()
    if low.count("<script") != 2 or low.count("</script") != 2:
        fail(f"{low.count('<script')} '<script' and {low.count('</script')} '</script' "
             "in the page, not its own 2")
    if "<!--" in page:
        fail("a comment opener '<!--' in the page")
    m = re.search(r'<script type="application/json" id="cuheap-data">(.*?)</script>', page, re.S)
    if not m:
        fail("no data element")
    for c in "<>&\u2028\u2029":
        if c in m.group(1):
            fail(f"{c!r} unescaped in the page's JSON")
    data = json.loads(m.group(1))
    gpu = data["processes"][0]["gpus"][0]
    if [x[1] for x in gpu["marks"]] != labels:
        fail(f"marks {[x[1] for x in gpu['marks']]!r}, not the trace's {labels!r}")
    if gpu["name"] != devices[0]:
        fail(f"device name {gpu['name']!r}, not the trace's {devices[0]!r}")
    drawn = "\n".join(s["site"] + "\n" + "\n".join(s["stack"]) for s in gpu["sites"])
    for fn in functions:
        if fn not in drawn:
            fail(f"function {fn!r} not in the chart's call sites:\n{drawn}")

    p = Page()
    p.feed(page)
    p.close()
    if p.tags - PAGE_TAGS:
        fail(f"elements the page does not write: {sorted(p.tags - PAGE_TAGS)}")
    if p.comments or len(p.scripts) != 2:
        fail(f"{p.comments} comments, {len(p.scripts)} scripts")
    if json.loads(p.scripts[0]) != data:
        fail("the data element's text is not the JSON")
    text = "".join(p.text)
    for want in [header["exe"], sys.argv[1]] + functions:
        if want not in text:
            fail(f"{want!r} not in the page's text")
    print("html safe: ok")


if __name__ == "__main__":
    main()
