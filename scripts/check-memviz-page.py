#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Open PyTorch memory_viz pages (torch.cuda._memory_viz trace_plot / segment_plot of a
`cuheap memviz` snapshot) in headless Chromium and check what a user would see: no error on
the console, the three views (Active Memory Timeline, Active Cached Segment Timeline,
Allocator State History) draw something, and Allocator State History can select its first,
middle and last events without an exception (issue 13: "Cannot read properties of null
(reading 'occupied')").

    scripts/check-memviz-page.py --viz DIR [--d3 d3.v7.min.js] PAGE.html...

The pages import MemoryViz.js, and it imports d3 and its own modules, from the network; this
fetches nothing: the page is served from a temporary folder on 127.0.0.1 with those imports
pointed at the files of DIR, PyTorch's torch/utils/viz/ as a source tree of the version to
check has it (MemoryViz.js and what it imports beside it, process_alloc_data.js today; the
wheel ships neither), and at a d3 build of the major version MemoryViz.js imports (d3 v7
today): --d3, else d3.v7.min.js or d3.min.js in DIR. Nothing of PyTorch's or d3's is kept in
this repository. A page that carries the module inline needs only d3.

Exit 0 when every page passes, 1 when one fails, 2 when a page cannot be checked.
"""
import argparse
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

VIEWS = ["Active Memory Timeline", "Active Cached Segment Timeline", "Allocator State History"]

# Runs in the page before MemoryViz: records errors, then drives each view the way a user
# does (the view menu, then clicks on events) and leaves its findings in the DOM.
DRIVER = r"""
<script>
window.__cuheap = {errors: [], views: {}, done: false};
window.addEventListener('error', e => __cuheap.errors.push('error: ' + e.message));
window.addEventListener('unhandledrejection', e => __cuheap.errors.push('rejection: ' + e.reason));
(() => {
  const orig = console.error;
  console.error = (...a) => { __cuheap.errors.push('console.error: ' + a.join(' ')); orig.apply(console, a); };
})();
// the views are divs of <body>; their menus sit in a div of their own since d3 v7's page
function __cuheap_visible() {
  return [...document.querySelectorAll('body > div')].filter(d => d.style.display !== 'none' && d.id !== 'cuheap-check');
}
function __cuheap_report() {
  __cuheap.done = true;
  const pre = document.createElement('pre');
  pre.id = 'cuheap-check';
  pre.style.display = 'none';
  pre.textContent = JSON.stringify({errors: __cuheap.errors, views: __cuheap.views});
  document.body.appendChild(pre);
}
function __cuheap_wait(cond, then, tries = 600) {
  if (cond()) return then();
  if (tries <= 0) { __cuheap.errors.push('timed out waiting for the page'); return __cuheap_report(); }
  setTimeout(() => __cuheap_wait(cond, then, tries - 1), 50);
}
function __cuheap_run() {
  const selects = document.querySelectorAll('select');
  const view = selects[1];
  const names = VIEWS_JSON;
  let i = 0;
  function next() {
    if (i === names.length) return __cuheap_report();
    const name = names[i++];
    const r = __cuheap.views[name] = {shown: false, marks: 0, events: 0, selected: []};
    if (![...view.options].some(o => o.text === name)) { r.missing = true; return next(); }
    view.value = name;
    view.dispatchEvent(new Event('change'));
    __cuheap_wait(() => __cuheap_visible().some(d => d.querySelector('svg')), () => {
      const div = __cuheap_visible().find(d => d.querySelector('svg'));
      r.shown = true;
      r.marks = div.querySelectorAll('svg polygon, svg rect, svg path').length;
      if (name !== 'Allocator State History') return next();
      const grid = div.querySelector('div');
      const list = [...grid.children].find(c => c.tagName === 'DIV' && c.querySelector('pre'));
      const events = list ? [...list.children] : [];
      r.events = events.length;
      const picks = [...new Set([0, Math.floor(events.length / 2), events.length - 1])].filter(k => k >= 0);
      for (const k of picks) {
        const before = __cuheap.errors.length;
        events[k].dispatchEvent(new MouseEvent('mousedown', {bubbles: true}));
        const rects = div.querySelectorAll('svg rect').length;
        r.selected.push({event: k, ok: __cuheap.errors.length === before, rects});
        r.marks = Math.max(r.marks, rects);
      }
      next();
    });
  }
  next();
}
window.addEventListener('load', () => __cuheap_wait(
  () => document.querySelectorAll('select').length >= 3 && __cuheap_visible().some(d => d.querySelector('svg')),
  __cuheap_run));
</script>
""".replace("VIEWS_JSON", json.dumps(VIEWS))

D3_IMPORT = re.compile(r'import\s+\*\s+as\s+(\w+)\s+from\s+["\']https?://[^"\']*/d3@[^"\']*["\'];?')
D3_NAMED = re.compile(r'import\s*\{([^}]*)\}\s*from\s*["\']https?://[^"\']*/d3-[\w-]+@[^"\']*["\'];?')
MEMORYVIZ_URL = re.compile(r'(from\s*["\'])(https?://[^"\']*/MemoryViz\.js)(["\'])')


def d3_locally(js):
    """The CDN imports of d3 and its modules, as names from the d3 bundle loaded before."""
    js = D3_IMPORT.sub(lambda m: "const %s = window.d3;" % m.group(1), js)

    def named(m):
        names = [n.strip() for n in m.group(1).split(",") if n.strip()]
        return "const {%s} = window.d3;" % ", ".join(n.replace(" as ", ": ") for n in names)

    return D3_NAMED.sub(named, js)


RELATIVE_IMPORT = re.compile(r'from\s*["\']\./([\w.-]+\.js)["\']')
D3_WANTED = re.compile(r'/d3@(\d+)')
D3_VERSION = re.compile(r'd3js\.org v(\d+)\.')


def missing(what):
    print("check-memviz-page: " + what, file=sys.stderr)
    sys.exit(2)


def viewer_files(viz, d3, need_viz):
    """The files to serve beside the page: {name: text}, d3 under d3.js. Exits 2 naming what is
    missing or of the wrong version."""
    files = {}
    if need_viz:
        if not viz:
            missing("the pages import MemoryViz.js from the network: give --viz DIR, the "
                    "torch/utils/viz/ folder of a PyTorch source tree")
        todo = ["MemoryViz.js"]
        while todo:
            name = todo.pop()
            path = os.path.join(viz, name)
            if not os.path.isfile(path):
                why = "" if name == "MemoryViz.js" else ", which MemoryViz.js imports"
                missing("%s is missing%s (--viz: the torch/utils/viz/ folder of a PyTorch "
                        "source tree)" % (path, why))
            files[name] = open(path, encoding="utf-8").read()
            todo += [n for n in RELATIVE_IMPORT.findall(files[name]) if n not in files]
    if not d3 and viz:
        d3 = next((os.path.join(viz, n) for n in ("d3.v7.min.js", "d3.min.js")
                   if os.path.isfile(os.path.join(viz, n))), None)
    if not d3 or not os.path.isfile(d3):
        missing("%s: no d3 build: give --d3 FILE, or put d3.v7.min.js in the --viz folder"
                % (d3 or "--d3"))
    files["d3.js"] = open(d3, encoding="utf-8").read()
    wanted = D3_WANTED.search(files.get("MemoryViz.js", ""))
    have = D3_VERSION.search(files["d3.js"][:300])
    if wanted and have and wanted.group(1) != have.group(1):
        missing("%s is d3 v%s; MemoryViz.js imports d3 v%s" % (d3, have.group(1), wanted.group(1)))
    return files


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return name
    sys.exit("check-memviz-page: no chromium (Debian: apt-get install chromium)")


def check(page, files, verbose):
    html = open(page, encoding="utf-8").read()
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(d3_locally(text) if name != "d3.js" else text)
        html = MEMORYVIZ_URL.sub(lambda m: m.group(1) + "./MemoryViz.js" + m.group(3), html)
        html = d3_locally(html)
        inject = '<script src="./d3.js"></script>' + DRIVER
        at = html.find("<script")
        html = html[:at] + inject + html[at:] if at >= 0 else inject + html
        with open(os.path.join(tmp, "page.html"), "w", encoding="utf-8") as f:
            f.write(html)
        handler = functools.partial(QuietHandler, directory=tmp)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = "http://127.0.0.1:%d/page.html" % server.server_address[1]
        profile = os.path.join(tmp, "profile")
        try:
            r = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                                "--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0",
                                "--virtual-time-budget=120000", "--dump-dom", url],
                               capture_output=True, text=True, timeout=600)
        finally:
            server.shutdown()
    m = re.search(r'<pre id="cuheap-check"[^>]*>(.*?)</pre>', r.stdout, re.S)
    if not m:
        print("%s: FAIL: the page never finished loading (chromium exit %d)" % (page, r.returncode))
        print("\n".join(l for l in r.stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l)[:3000])
        return 1
    import html as htmllib

    found = json.loads(htmllib.unescape(m.group(1)))
    uncaught = [l for l in r.stderr.splitlines() if "Uncaught" in l]
    problems = list(found["errors"]) or uncaught  # the same errors, as Chromium logs them
    for name in VIEWS:
        v = found["views"].get(name, {})
        if v.get("missing"):
            problems.append("%s: not in the page's view menu" % name)
        elif not v.get("shown") or not v.get("marks"):
            problems.append("%s: drew nothing" % name)
    hist = found["views"].get("Allocator State History", {})
    for s in hist.get("selected", []):
        if not s["ok"]:
            problems.append("Allocator State History: selecting event %d raised an error" % s["event"])
    if len(hist.get("selected", [])) < min(3, hist.get("events", 0)) or not hist.get("events"):
        problems.append("Allocator State History: no events to select")
    summary = "; ".join(
        "%s %d marks%s" % (n, found["views"].get(n, {}).get("marks", 0),
                           ", events %s selected" % ",".join(str(s["event"]) for s in hist.get("selected", []))
                           if n == "Allocator State History" else "")
        for n in VIEWS)
    if problems:
        print("%s: FAIL (%s)" % (page, summary))
        for p in problems[:20]:
            print("  " + p)
        return 1
    print("%s: ok (%s)" % (page, summary))
    if verbose:
        print(json.dumps(found, indent=1))
    return 0


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--viz", help="PyTorch's torch/utils/viz/ folder (MemoryViz.js and the "
                    "modules it imports), and a d3 build unless --d3")
    ap.add_argument("--d3", help="a d3 bundle of the version MemoryViz.js imports (d3.v7.min.js)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("pages", nargs="+")
    a = ap.parse_args()
    for p in a.pages:
        if not os.path.isfile(p):
            missing("%s: no such file" % p)
    if a.viz and not os.path.isdir(a.viz):
        missing("--viz %s: not a folder" % a.viz)
    need_viz = any(MEMORYVIZ_URL.search(open(p, encoding="utf-8").read()) for p in a.pages)
    files = viewer_files(a.viz, a.d3, need_viz)
    worst = 0
    for p in a.pages:
        worst = max(worst, check(p, files, a.verbose))
    return worst


if __name__ == "__main__":
    sys.exit(main())
