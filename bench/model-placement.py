#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A model, not the pool: what a job's recorded sequence would hold if no memory were ever given
back and every block were placed where it first fits, by address, with no fences and no threads:
blocks of a granule (2 MiB) or more on runs of whole granules (no buddy, no alignment beyond the
granule), smaller ones in granules of their own at 512 B (or rounded to size classes). The
memory it holds is every granule any block has touched; a warm step that touches none makes no
mapping call. So it bounds what placement alone buys a pool that never remaps: compare its
held/live with the pool's (bench/run-corpus.sh: held over the driver alone, times drv/lv).

  bench/model-placement.py [--classes 0,4,1] [--shared] [--give-back]
                           bench/sequences/NAME.jsonl.gz ...

--classes: below a granule, sizes rounded to 512 B (0), to N classes between powers of two
(4: 1.25, 1.5, 1.75, 2 x), or to powers of two (1: a buddy's rounding). Prints per sequence
and setting held/live and the granules first touched a step in the sequence's second half.
--shared: blocks below a granule share one first-fit address space with the larger ones (at
512 B), as they share a buddy's arena in the pool, instead of granules of their own.
--give-back: memory goes back as the pool's does. A granule with no block left is idle and
stays mapped while the mapped granules stay within the most ever busy at once plus one (the
pool's budget and its 2 MiB cushion); past that the highest idle ones are released. Held is
then the most granules mapped at once, and a late step's granules made or released, each run of
neighbours counted once, are its mapping operations (the pool's operations a warm step).
"""
import argparse
import bisect
import gzip
import json

GRANULE = 2 << 20
UNIT = 512


def events(path):
    out = []
    with gzip.open(path, "rt") as f:
        for line in f:
            if '"event"' not in line:
                continue
            e = json.loads(line)
            kind = e["event"]
            if kind == "alloc":
                out.append(("a", int(e["ptr"], 16), e["size"]))
            elif kind == "free":
                out.append(("f", int(e["ptr"], 16), 0))
            elif kind == "mark":
                out.append(("m", 0, 0))
    return out


class FirstFit:
    """Free runs [start, end) of units, by address; the lowest that fits is taken."""

    def __init__(self):
        self.starts, self.ends = [0], [1 << 50]

    def alloc(self, n):
        i = next(i for i, (s, e) in enumerate(zip(self.starts, self.ends)) if e - s >= n)
        s = self.starts[i]
        if self.ends[i] - s == n:
            del self.starts[i], self.ends[i]
        else:
            self.starts[i] = s + n
        return s

    def free(self, s, n):
        e = s + n
        i = bisect.bisect_left(self.starts, s)
        joins_prev = i > 0 and self.ends[i - 1] == s
        joins_next = i < len(self.starts) and self.starts[i] == e
        if joins_prev and joins_next:
            self.ends[i - 1] = self.ends[i]
            del self.starts[i], self.ends[i]
        elif joins_prev:
            self.ends[i - 1] = e
        elif joins_next:
            self.starts[i] = s
        else:
            self.starts.insert(i, s)
            self.ends.insert(i, e)


def rounded_units(size, classes):
    n = max(1, (size + UNIT - 1) // UNIT)
    if classes:
        top = 1 << (n.bit_length() - 1)
        if top != n:
            step = max(1, top // classes)
            n = (n + step - 1) // step * step
    return n


def runs(granules):
    """Runs of neighbouring granules in a sorted list: one mapping operation each."""
    return sum(1 for i, g in enumerate(granules) if i == 0 or granules[i - 1] != (g[0], g[1] - 1))


def run(evs, classes, shared=False, give_back=False):
    large, small = FirstFit(), FirstFit()
    if shared:
        small = large
    touched = set()
    users, mapped = {}, set()
    busy = busy_peak = mapped_peak = late_ops = 0
    live, live_bytes, peak_live = {}, 0, 0
    nr_marks = sum(1 for e in evs if e[0] == "m")
    steps = new_late = 0
    for kind, ptr, size in evs:
        if kind == "m":
            steps += 1
            continue
        if kind == "f":
            v = live.pop(ptr, None)
            if v:
                (large if v[0] == "L" else small).free(v[1], v[2])
                live_bytes -= v[3]
                if give_back:
                    for g in v[4]:
                        users[g] -= 1
                        busy -= users[g] == 0
                    over = len(mapped) - (busy_peak + 1)
                    if over > 0:
                        idle = sorted((g for g in mapped if not users.get(g)), reverse=True)[:over]
                        mapped.difference_update(idle)
                        late_ops += runs(sorted(idle)) if steps * 2 >= nr_marks > 0 else 0
            continue
        if size >= GRANULE and not shared:
            n = (size + GRANULE - 1) // GRANULE
            s = large.alloc(n)
            granules = [("L", g) for g in range(s, s + n)]
            live[ptr] = ("L", s, n, size, granules)
        else:
            n = rounded_units(size, classes) if size < GRANULE else (size + UNIT - 1) // UNIT
            s = small.alloc(n)
            granules = [("S", g) for g in range(s * UNIT // GRANULE, ((s + n) * UNIT - 1) // GRANULE + 1)]
            live[ptr] = ("S", s, n, size, granules)
        for g in granules:
            if g not in touched:
                touched.add(g)
                new_late += steps * 2 >= nr_marks > 0
        if give_back:
            new = [g for g in granules if g not in mapped]
            late_ops += runs(new) if steps * 2 >= nr_marks > 0 else 0
            mapped.update(new)
            for g in granules:
                users[g] = users.get(g, 0) + 1
                busy += users[g] == 1
            busy_peak = max(busy_peak, busy)
            mapped_peak = max(mapped_peak, len(mapped))
        live_bytes += size
        peak_live = max(peak_live, live_bytes)
    late_steps = max(nr_marks - nr_marks // 2, 1)
    if give_back:
        return peak_live, mapped_peak * GRANULE, late_ops / late_steps
    return peak_live, len(touched) * GRANULE, new_late / late_steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--classes", default="0,4,1")
    ap.add_argument("--shared", action="store_true")
    ap.add_argument("--give-back", action="store_true")
    ap.add_argument("sequences", nargs="+")
    args = ap.parse_args()
    for path in args.sequences:
        evs = events(path)
        words = []
        for c in (int(x) for x in args.classes.split(",")):
            peak_live, held, late = run(evs, c, args.shared, args.give_back)
            words.append("classes=%d held_over_live=%.3f %s=%.1f"
                         % (c, held / peak_live if peak_live else 0,
                            "late_ops_per_step" if args.give_back else "late_new_granules_per_step",
                            late))
        print(path.rsplit("/", 1)[-1].split(".")[0], "peak_live_mib=%d" % (peak_live >> 20),
              " | ".join(words), flush=True)


if __name__ == "__main__":
    main()
