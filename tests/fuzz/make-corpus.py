#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the seed corpus in tests/fuzz/corpus/<target>/ from a real trace (the demo's,
out/demo.jsonl, which scripts/demo.sh writes) and from hand-made cases: truncated and
damaged traces, every event kind, settings values, command lines. Seeds stay small (libFuzzer
mutates small inputs faster); run it again after a trace format change and commit the result.

usage: tests/fuzz/make-corpus.py [out/demo.jsonl]
"""
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
demo_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "../../out/demo.jsonl")
demo = open(demo_path).read().splitlines(keepends=True)
header, footer = demo[0], demo[-1]
# the demo's first lines hold one of each thing it records: device, stacks, allocations, marks
body = demo[1:40]
# the first free and fence, which come later
body += [l for l in demo if '"event":"free"' in l][:3] + [l for l in demo if '"event":"fence"' in l][:1]


def ev(seq, t, kind, **kw):
    o = {"type": "event", "seq": seq, "t": t, "event": kind, "api": kw.pop("api", "cuMemAlloc"),
         "device": kw.pop("device", 0), "tid": kw.pop("tid", 1)}
    o.update(kw)
    return json.dumps(o, separators=(",", ":")) + "\n"


small_header = ('{"type":"header","format":"cuheap-trace","version":1,"pid":42,"rank":3,'
                '"exe":"/opt/train","start_unix_ns":1796084546249474579,"unwinder":"libunwind",'
                '"config":{"CUHEAP_POOL":"1","CUHEAP_REUSE":"fence"}}\n')
dev = lambda d: '{"type":"device","device":%d,"name":"H200 %d","total":150000000000}\n' % (d, d)
py_stack = ('{"type":"stack","id":7,"frames":[{"ip":"0x7f0000001234","module":"/usr/lib/libtorch_cuda.so",'
            '"offset":"0x1234","function":"_ZN3c104cuda20CUDACachingAllocator6mallocEv"},'
            '{"ip":"0x5555","module":"/usr/bin/python3.11","offset":"0x99"}],'
            '"python":[{"file":"/usr/lib/python3/dist-packages/torch/nn/modules/linear.py","line":114,"function":"forward"},'
            '{"file":"train.py","line":42,"function":"step"},{"file":"<frozen runpy>","line":1,"function":"<module>"}]}\n')
kinds = [
    ev(1, 10, "arena_grow", api="none", ptr="0x7f0000000000", size=33554432, actual=33554432, pooled=True, reserved=33554432),
    ev(2, 20, "alloc", ptr="0x7f0000000000", size=1000, actual=1024, pooled=True, stack=7),
    ev(3, 30, "alloc", api="cuMemAllocAsync", ptr="0x9000", size=4096, actual=4096, stream="0x55", stack=7),
    ev(4, 35, "alloc", api="cuMemAllocManaged", device=1, ptr="0xa000", size=8192, actual=8192),
    ev(5, 36, "alloc", api="cuMemHostAlloc", device=-1, ptr="0xb000", size=64, actual=64),
    ev(6, 37, "alloc", api="cuMemCreate", ptr="0xc000", size=2097152, actual=2097152),
    ev(7, 38, "alloc", api="cuMemMap", ptr="0xd000", size=2097152, actual=2097152),
    ev(8, 39, "alloc", api="torch_pluggable", ptr="0xe000", size=512, actual=512, pooled=True, stream="0x55"),
    ev(9, 40, "mark", api="none", label="step 0 \u00e9 <b>&\""),
    ev(10, 50, "free", ptr="0x7f0000000000", size=1000, actual=1024, pooled=True),
    ev(11, 55, "fence", api="none", pooled=True, blocks=64, bytes=2746368),
    ev(12, 60, "oom", ptr="0x0", size=8589934592, actual=0, stack=7, result=2, driver_free=0, driver_total=268435456, limit=0),
    ev(13, 61, "limit", ptr="0x0", size=4194304, actual=0, result=2, driver_free=4196401152, driver_total=100663296, limit=100663296),
    ev(14, 70, "arena_release", api="none", ptr="0x7f0000000000", size=33554432, actual=33554432, pooled=True, reserved=0),
    ev(15, 80, "alloc", api="cuMemAllocPitch", device=1, ptr="0xf000", size=3000, actual=3072, stack=99),
]
small_footer = '{"type":"footer","events":15,"written":15,"dropped":2,"stacks":1,"t":80}\n'

traces = {
    "demo-head": header + "".join(body) + footer,
    "demo-no-footer": header + "".join(body),
    "demo-killed-mid-line": header + "".join(body[:20]) + body[20][: len(body[20]) // 2],
    "demo-header-only": header,
    "every-kind": small_header + dev(0) + dev(1) + py_stack + "".join(kinds) + small_footer,
    # several threads: seq order is not time order (issue 12: html's curve)
    "threads-out-of-order": small_header + dev(0) + "".join(
        ev(i, 1000 - 37 * i if i % 2 else 10 * i, "alloc" if i % 3 else "free", tid=i % 4,
           ptr="0x%x" % (0x1000 * (i // 3 + 1)), size=512 * i, actual=512 * i, pooled=bool(i % 2))
        for i in range(1, 40)) + small_footer,
    # damage a real run can leave, and lines a newer cuheap might write
    "bad-lines": small_header + "garbage\n" + '{"no":"type"}\n' + '[1,2]\n'
        + '{"type":"event","seq":1,"event":"teleport","t":1}\n'
        + '{"type":"mystery"}\n' + kinds[1] + '{"type":"stack","id":"x","frames":{}}\n' + small_footer,
    "hex-and-huge": small_header + ev(1, "0x10", "alloc", ptr="0xffffffffffffffff", size="0x8000000000000000",
        actual=18446744073709551615, stack=4294967296) + ev(2, 1, "free", ptr="0xffffffffffffffff",
        size=-1, actual="zz") + small_footer,
    "newer-version": small_header.replace('"version":1', '"version":2'),
    "chrome-trace": '[{"name":"process_name","ph":"M","pid":1,"args":{"name":"cuheap"}},\n',
    "not-cuheap": '{"format":"something-else"}\n',
    "many-devices": small_header + "".join(dev(d) for d in range(70)) + small_footer,
}

settings = {
    "defaults": "",
    "every-variable": "".join(f"{k}={v}\n" for k, v in [
        ("CUHEAP_POOL", "1"), ("CUHEAP_POOL_INIT", "0"), ("CUHEAP_ARENA_SIZE", "256M"),
        ("CUHEAP_MIN_BLOCK", "512"), ("CUHEAP_POOL_MAX", "64M"), ("CUHEAP_RELEASE", "oom"),
        ("CUHEAP_REUSE", "fence"), ("CUHEAP_FENCE_BATCH", "64"), ("CUHEAP_LIMIT", "none"),
        ("CUHEAP_RECORD", "1"), ("CUHEAP_STACK_DEPTH", "32"), ("CUHEAP_PYTHON", "1"),
        ("CUHEAP_RING", "65536"), ("CUHEAP_OUTPUT", "cuheap-%p.jsonl"), ("CUHEAP_FORMAT", "jsonl"),
        ("CUHEAP_SUMMARY", "1"), ("CUHEAP_VERBOSE", "0"), ("CUHEAP_FLUSH_MS", "200")]),
    "sizes": "CUHEAP_ARENA_SIZE=1GiB\nCUHEAP_POOL_MAX=1.5g\nCUHEAP_POOL_INIT=64 MB\nCUHEAP_LIMIT=80%\n",
    "limit-percent": "CUHEAP_LIMIT=12.35%\n",
    "limit-bytes": "CUHEAP_LIMIT=17179869184\n",
    "bad-values": "CUHEAP_POOL=maybe\nCUHEAP_ARENA_SIZE=3M\nCUHEAP_RING=100\nCUHEAP_STACK_DEPTH=-1\n"
                  "CUHEAP_LIMIT=101%\nCUHEAP_FENCE_BATCH=0x10\nCUHEAP_REUSE=later\nCUHEAP_OUTPUT=\n",
    "edges": "CUHEAP_POOL_MAX=1T\nCUHEAP_MIN_BLOCK=4M\nCUHEAP_ARENA_SIZE=2M\nCUHEAP_FLUSH_MS=60000\n"
             "CUHEAP_POOL_INIT=1e300\nCUHEAP_LIMIT=nan\nCUHEAP_RING=4194304\n",
    "output-template": "CUHEAP_OUTPUT=/tmp/%h/r%r-%p-%%-%x-%\nCUHEAP_FORMAT=CHROME\nCUHEAP_RELEASE=Never\n",
}

cmdlines = {
    "help": ["help"],
    "report": ["report", "@0"],
    "report-several": ["report", "@0", "@1"],
    "top": ["top", "-n", "3", "--by", "total", "@0"],
    "leaks": ["leaks", "-n5", "@1"],
    "chrome": ["chrome", "-o", "out.json", "@0", "@1"],
    "folded": ["folded", "--by=peak", "@0"],
    "memviz": ["memviz", "-o", "x.pickle", "@0"],
    "html": ["html", "-o", "-", "@0"],
    "check": ["check", "@0", "@1", "@2", "@3", "@4", "@5"],
    "run": ["run", "-o", "t-%p.jsonl", "-f", "chrome", "--no-pool", "--reuse", "sync",
            "--limit", "80%", "--stack-depth", "12", "--", "prog", "arg"],
    "run-bad": ["run", "--reuse", "later", "prog"],
    "unknown": ["frobnicate", "-x"],
}

# events target: 8-byte records (tests/fuzz/fuzz-analysis.c from_records())
def rec(kind, api=1, pooled=0, dev=0, addr=0, size=512, shift=0, stack=1, dt=1):
    return bytes([kind - 1, api | pooled << 7, dev, addr, size & 255, size >> 8 & 255,
                  shift | stack << 5, dt & 255])


ALLOC, FREE, GROW, RELEASE, FENCE, OOM, LIMIT, MARK = range(1, 9)
events = {
    "every-kind": b"".join([rec(GROW, api=0, pooled=1, size=1, shift=25), rec(ALLOC, pooled=1),
                            rec(ALLOC, api=3, addr=1, stack=3), rec(MARK, api=0), rec(FREE, pooled=1),
                            rec(FENCE, api=0), rec(OOM, size=1, shift=31), rec(LIMIT, stack=7),
                            rec(ALLOC, api=6, dev=128), rec(RELEASE, api=0, size=1, shift=25)]),
    # a long run in time order: the size that fills html's chart (1500 points) and more
    "long-in-order": b"".join(rec(ALLOC if i % 2 == 0 else FREE, addr=(i // 2) % 64,
                                  size=100 + i, stack=i % 8, dt=3) for i in range(2000)),
    # threads: time goes back and forth in seq order
    "threads": b"".join(rec(ALLOC if i % 3 else FREE, addr=i % 17, size=i * 7, stack=i % 8,
                            dt=(-50 if i % 2 else 60)) for i in range(300)),
    "many-devices": b"".join(rec(ALLOC, dev=128 + 1 + d, addr=d % 64, size=4096) for d in range(79)),
}

out = os.path.join(here, "corpus")


def write(target, name, text):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "w") as f:
        f.write(text)


for name, text in traces.items():
    write("tracereader", name, text)
    write("analysis", name, text)
for name, text in settings.items():
    write("config", name, text)
for name, argv in cmdlines.items():
    write("cmdline", name, "\0".join(argv))
for name, data in events.items():
    os.makedirs(os.path.join(out, "events"), exist_ok=True)
    with open(os.path.join(out, "events", name), "wb") as f:
        f.write(data)
