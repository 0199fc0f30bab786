#!/usr/bin/env python3
"""Summarize a per-CTA timeline of the decode kernel (diagnostic builds only).

Build with -DCMAKE_CUDA_FLAGS=-DKVT_ATTN_TRACE -DCMAKE_C_FLAGS=-DKVT_ATTN_TRACE,
then run e.g.

    KVT_ATTN_TRACE_FILE=/tmp/tr.txt kvtier bench attn --shape 8x32768 --iters 3
    python3 bench/attn_trace.py /tmp/tr.txt

One run per file (the bench appends). Each line is one CTA of the last timed
decode of a format, the first 65536 CTAs only:
format B T cta smid start loop_end end (global timer, ns; cta is the linear
index, batch-major). Prints, per format, when CTAs start, when warp 0 leaves
its tile loop and when the CTA ends (us from the first start), and loop ends
by sequence and by the number of CTAs sharing the multiprocessor: a spread
there is time the kernel waits on its slowest CTAs.
"""
import collections
import statistics as st
import sys


def summary(v):
    v = sorted(v)
    return "min %6.1f  median %6.1f  max %6.1f" % (v[0], st.median(v), v[-1])


def main(path):
    runs = collections.defaultdict(list)
    for line in open(path):
        f, B, T, i, sm, t0, t1, t2 = line.split()
        runs[(f, int(B), int(T))].append(
            (int(i), int(sm), int(t0), int(t1), int(t2)))
    for (f, B, T), r in runs.items():
        z = min(x[2] for x in r)
        if len(r) >= 65536:
            print("%s %d x %d: more than 65536 CTAs, only the first kept: "
                  "per-sequence rows are not meaningful" % (f, B, T))
        per_b = max(1, len(r) // B)
        on_sm = collections.Counter(x[1] for x in r)
        print("%s  %d x %d  (%d CTAs)" % (f, B, T, len(r)))
        print("  start     ", summary([(x[2] - z) / 1e3 for x in r]))
        print("  loop end  ", summary([(x[3] - z) / 1e3 for x in r]))
        print("  end       ", summary([(x[4] - z) / 1e3 for x in r]))
        by_b = collections.defaultdict(list)
        by_load = collections.defaultdict(list)
        for i, sm, t0, t1, t2 in r:
            by_b[i // per_b].append((t1 - z) / 1e3)
            by_load[on_sm[sm]].append((t1 - z) / 1e3)
        for k in sorted(by_load):
            print("  loop end, %d CTAs on the SM: %s" % (k, summary(by_load[k])))
        for k in sorted(by_b):
            print("  loop end, sequence %3d:      %s" % (k, summary(by_b[k])))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: attn_trace.py TRACE_FILE")
    main(sys.argv[1])
