#!/usr/bin/env python3
"""Lines up two ranks' anatomy logs (transport built with the `anatomy` feature, run with
GPULMT_ANATOMY_OUT=PREFIX) into the steps of a ping-pong leg, and prints the median time
of each step after the leg's start: the moment the previous receiver saw its copy finish.

Usage: anatomy.py PREFIX [MAX_LEG_US]   (reads PREFIX.0.csv and PREFIX.1.csv)
Output: CSV `step,median_us_after_start,median_us_after_previous_step,legs` for the legs
whose copy an RTS started (GET), then, prefixed `rtr `, for those an RTR offer started
(the sender pushes; GPULMT_RTR_PUT_MAX), then per rank
the median of its copy issue (CopyIssue to CopyIssued: the driver calls) and of its polls
per copy; a rank whose driver calls run slow (a busy neighbour of its CPU, interrupts)
shows there, apart from the other.
"""
import csv
import sys

from anatomy_points import POINT, PROBE as PROBE_ARG

SEND_POST, RECV_POST, PACKET_IN, PACKET_OUT = (POINT[n] for n in ("SendPost", "RecvPost", "PacketIn", "PacketOut"))
COPY_ISSUE, COPY_ISSUED, COPY_DONE = (POINT[n] for n in ("CopyIssue", "CopyIssued", "CopyDone"))
COMPLETED, PROBE = POINT["Completed"], POINT["Probe"]
RECV_CLASSIFIED, RECV_DESCRIBED, RECV_POSTED, SEND_OFFER_WAITED, SEND_POSTED, PACKET_HANDLED = (
    PROBE_ARG[n]
    for n in ("RECV_CLASSIFIED", "RECV_DESCRIBED", "RECV_POSTED", "SEND_OFFER_WAITED", "SEND_POSTED", "PACKET_HANDLED")
)
# Packet kind bytes (protocols/src/wire.rs).
RTS, DONE, RTR = 2, 5, 11

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

# A leg of an RTR ping-pong: x pushed its message and saw the copy finish; y's next send
# pushes into the receive x offered.
RTR_STEPS = [
    ("x: DONE written to the ring", "x", PACKET_OUT, DONE),
    ("x: send completed", "x", COMPLETED, None),
    ("x: irecv entered", "x", RECV_POST, None),
    ("x: irecv: buffer classified", "x", PROBE, RECV_CLASSIFIED),
    ("x: irecv: buffer described", "x", PROBE, RECV_DESCRIBED),
    ("x: irecv: engine posted it", "x", PROBE, RECV_POSTED),
    ("x: RTR written to the ring", "x", PACKET_OUT, RTR),
    ("y: DONE taken from the ring", "y", PACKET_IN, DONE),
    ("y: receive completed", "y", COMPLETED, None),
    ("y: isend entered", "y", SEND_POST, None),
    ("y: RTR taken from the ring", "y", PACKET_IN, RTR),
    ("y: RTR handled", "y", PROBE, PACKET_HANDLED),
    ("y: isend: offer wait over", "y", PROBE, SEND_OFFER_WAITED),
    ("y: isend: engine posted it", "y", PROBE, SEND_POSTED),
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


def flow(ev, a, b, y):
    """GET or RTR: the kind of the last packet y took before it issued its copy."""
    last = None
    for e in ev[a + 1 : b + 1]:
        if e[1] == y and e[2] == PACKET_IN:
            last = e[3]
        if e[1] == y and e[2] == COPY_ISSUE:
            break
    return "rtr" if last == RTR else "get"


def table(title, steps, legs):
    offsets = [[r[i] for r in legs] for i in range(len(steps))]
    for i, (name, *_rest) in enumerate(steps):
        m = median(offsets[i])
        d = m if i == 0 else median([legs[k][i] - legs[k][i - 1] for k in range(len(legs))])
        print(f"{title}{name},{m:.3f},{d:.3f},{len(legs)}")


def main():
    prefix = sys.argv[1]
    max_leg = float(sys.argv[2]) if len(sys.argv) > 2 else 50.0
    ev = sorted(load(f"{prefix}.0.csv", 0) + load(f"{prefix}.1.csv", 1))
    starts = [i for i, e in enumerate(ev) if e[2] == COPY_DONE]
    legs = {"get": [], "rtr": []}
    polls = []
    for a, b in zip(starts, starts[1:]):
        x = ev[a][1]
        if ev[b][1] == x:
            continue  # two copies in a row on one rank: not a ping-pong leg
        t0 = ev[a][0]
        if (ev[b][0] - t0) / 1e3 > max_leg:
            continue
        polls.append(ev[b][3])
        kind = flow(ev, a, b, 1 - x)
        row = []
        # Each rank's steps are in its time order: a step is looked for after that
        # rank's previous one (a probe recurs within a leg, e.g. after every packet).
        after = {x: a + 1, 1 - x: a + 1}
        for name, whose, point, arg in STEPS if kind == "get" else RTR_STEPS:
            rank = x if whose == "x" else 1 - x
            hit = next(
                (i for i in range(after[rank], b + 1)
                 if ev[i][1] == rank and ev[i][2] == point and (arg is None or ev[i][3] == arg)),
                None,
            )
            if hit is not None:
                after[rank] = hit + 1
            row.append(None if hit is None else (ev[hit][0] - t0) / 1e3)
        if all(r is not None for r in row):
            legs[kind].append(row)
    print("step,median_us_after_start,median_us_after_previous_step,legs")
    if legs["get"] or not legs["rtr"]:
        table("", STEPS, legs["get"])
    if legs["rtr"]:
        table("rtr ", RTR_STEPS, legs["rtr"])
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
