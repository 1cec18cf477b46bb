#!/usr/bin/env python3
"""Lines up two ranks' anatomy logs (transport built with the `anatomy` feature, run with
GPULMT_ANATOMY_OUT=PREFIX) into the steps of a ping-pong leg, and prints the median time
of each step after the leg's start: the moment the previous receiver saw its copy finish.

Usage: anatomy.py PREFIX [MAX_LEG_US]   (reads PREFIX.0.csv and PREFIX.1.csv)
Output: CSV `step,median_us_after_start,median_us_after_previous_step,legs`, then per rank
the median of its copy issue (CopyIssue to CopyIssued: the driver calls) and of its polls
per copy; a rank whose driver calls run slow (a busy neighbour of its CPU, interrupts)
shows there, apart from the other.
"""
import csv
import sys

SEND_POST, RECV_POST, PACKET_IN, PACKET_OUT, COPY_ISSUE, COPY_ISSUED, COPY_DONE, COMPLETED = range(1, 9)
RTS, DONE = 2, 5

# (name, whose: 'x' = the rank whose copy just finished, 'y' = the other, point, arg or None)
STEPS = [
    ("x: DONE written to the ring", "x", PACKET_OUT, DONE),
    ("x: receive completed", "x", COMPLETED, None),
    ("x: isend entered", "x", SEND_POST, None),
    ("x: RTS written to the ring", "x", PACKET_OUT, RTS),
    ("y: DONE taken from the ring", "y", PACKET_IN, DONE),
    ("y: send completed", "y", COMPLETED, None),
    ("y: irecv entered", "y", RECV_POST, None),
    ("y: RTS taken from the ring", "y", PACKET_IN, RTS),
    ("y: copy issue begins", "y", COPY_ISSUE, None),
    ("y: copy issued (driver call returned)", "y", COPY_ISSUED, None),
    ("y: copy seen finished (next leg starts)", "y", COPY_DONE, None),
]


def load(path, rank):
    with open(path) as f:
        return [(int(r["ns"]), rank, int(r["point"]), int(r["arg"])) for r in csv.DictReader(f)]


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if v else float("nan")


def main():
    prefix = sys.argv[1]
    max_leg = float(sys.argv[2]) if len(sys.argv) > 2 else 50.0
    ev = sorted(load(f"{prefix}.0.csv", 0) + load(f"{prefix}.1.csv", 1))
    starts = [i for i, e in enumerate(ev) if e[2] == COPY_DONE]
    offsets = [[] for _ in STEPS]
    polls = []
    for a, b in zip(starts, starts[1:]):
        x = ev[a][1]
        if ev[b][1] == x:
            continue  # two copies in a row on one rank: not a ping-pong leg
        t0 = ev[a][0]
        if (ev[b][0] - t0) / 1e3 > max_leg:
            continue
        polls.append(ev[b][3])
        row = []
        for name, whose, point, arg in STEPS:
            rank = x if whose == "x" else 1 - x
            hit = next(
                (e for e in ev[a + 1 : b + 1] if e[1] == rank and e[2] == point and (arg is None or e[3] == arg)),
                None,
            )
            row.append(None if hit is None else (hit[0] - t0) / 1e3)
        if all(r is not None for r in row):
            for i, r in enumerate(row):
                offsets[i].append(r)
    print("step,median_us_after_start,median_us_after_previous_step,legs")
    prev = None
    for i, (name, *_rest) in enumerate(STEPS):
        m = median(offsets[i])
        d = m if i == 0 else median([offsets[i][k] - offsets[i - 1][k] for k in range(len(offsets[i]))])
        print(f"{name},{m:.3f},{d:.3f},{len(offsets[i])}")
        prev = m
    print(f"copy polls (median),{median(polls)},,{len(polls)}")
    for rank in (0, 1):
        issue, rank_polls, begun = [], [], None
        for ns, r, point, arg in ev:
            if r != rank:
                continue
            if point == COPY_ISSUE:
                begun = ns
            elif point == COPY_ISSUED and begun is not None:
                issue.append((ns - begun) / 1e3)
                begun = None
            elif point == COPY_DONE:
                rank_polls.append(arg)
        print(f"rank {rank}: copy issue (driver calls),{median(issue):.3f},,{len(issue)}")
        print(f"rank {rank}: copy polls (median),{median(rank_polls)},,{len(rank_polls)}")


if __name__ == "__main__":
    main()
