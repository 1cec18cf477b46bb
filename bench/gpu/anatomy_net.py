#!/usr/bin/env python3
"""Lines up two ranks' anatomy logs of a ping-pong across nodes (osu_latency built with the
transport's `anatomy` feature and `mpi`, run under mpirun across 2 pseudo-nodes with
GPULMT_ANATOMY_OUT=PREFIX) into the steps of one eager leg through the internode path, and
prints the median time of each step after the leg's start (the sender's isend entered):
where an 8 B D D message's latency goes: post (the device payload copied out to the host,
the control packet written into the GIO queue), proxy pick-up, MPI (send to arrival at
the other proxy), delivery to the receiving context, the payload's copy into device memory, completion.
Host payloads (H H) have no copy steps: their legs are not found; use D D.

Usage: anatomy_net.py PREFIX [MAX_LEG_US]   (reads PREFIX.0.csv and PREFIX.1.csv; both
hold the context's and the proxy thread's points, transport/src/anatomy.rs)
Output: CSV `step,median_us_after_start,median_us_after_previous_step,legs` (the send
completion's previous step is MPI's acceptance of the send).
"""
import csv
import statistics
import sys

from anatomy_points import POINT, PROBE as PROBE_ARG

SEND_POST, PACKET_OUT, COMPLETED, PROBE = (POINT[n] for n in ("SendPost", "PacketOut", "Completed", "Probe"))
NET_TAKEN, NET_ISSUED, NET_ARRIVED, NET_PUBLISHED, NET_PACKET_IN = (
    POINT[n] for n in ("NetTaken", "NetIssued", "NetArrived", "NetPublished", "NetPacketIn")
)

# Probe args, as points of their own: PROBE * 1000 + arg.
SEND_PAYLOAD_STAGED, RECV_PAYLOAD_COPY, RECV_PAYLOAD_WRITTEN, SEND_CLASSIFIED, COPY_WAIT_ISSUED, COPY_WAIT_DONE, \
    NET_SEND_CALL, NET_HANDED_OVER = (
        PROBE * 1000 + PROBE_ARG[n]
        for n in ("SEND_PAYLOAD_STAGED", "RECV_PAYLOAD_COPY", "RECV_PAYLOAD_WRITTEN", "SEND_CLASSIFIED",
                  "COPY_WAIT_ISSUED", "COPY_WAIT_DONE", "NET_SEND_CALL", "NET_HANDED_OVER")
    )

# (name, whose: 'x' = the sender, 'y' = the receiver, point)
STEPS = [
    ("x: isend entered (leg starts)", "x", SEND_POST),
    ("x: buffer classified, eager decided", "x", SEND_CLASSIFIED),
    ("x: payload's copy to the host issued", "x", COPY_WAIT_ISSUED),
    ("x: payload's copy seen finished", "x", COPY_WAIT_DONE),
    ("x: device payload copied out to the host", "x", SEND_PAYLOAD_STAGED),
    ("x: control packet committed to the GIO queue", "x", PACKET_OUT),
    ("x proxy: packet taken from the queue", "x", NET_TAKEN),
    ("x proxy: MPI_Isend called", "x", NET_SEND_CALL),
    ("x proxy: MPI_Isend accepted", "x", NET_ISSUED),
    ("y proxy: control message arrived from MPI", "y", NET_ARRIVED),
    ("y proxy: arrivals handed to the context", "y", NET_HANDED_OVER),
    ("y: packet taken by the context", "y", NET_PACKET_IN),
    ("y: payload copy into device memory starts", "y", RECV_PAYLOAD_COPY),
    ("y: payload's copy to the device issued", "y", COPY_WAIT_ISSUED),
    ("y: payload's copy seen finished", "y", COPY_WAIT_DONE),
    ("y: payload landed in device memory", "y", RECV_PAYLOAD_WRITTEN),
    ("y: receive completed", "y", COMPLETED),
    ("x proxy: send completion published", "x", NET_PUBLISHED),
]


def load(path):
    """(ns, point) pairs; a probe's point is PROBE * 1000 + its arg."""
    with open(path) as f:
        rows = [(int(r["ns"]), int(r["point"]), int(r["arg"])) for r in csv.DictReader(f)]
    return [(t, p * 1000 + a if p == PROBE else p) for t, p, a in rows]


def legs(logs, max_ns, steps):
    """Every leg: for each isend of a rank, the first of each step after the step before."""
    out = []
    for x in (0, 1):
        y = 1 - x
        events = {"x": logs[x], "y": logs[y]}
        # Per rank and point, the times in order, for a forward search.
        index = {w: {} for w in events}
        for w, ev in events.items():
            for t, p in ev:
                index[w].setdefault(p, []).append(t)
        starts = index["x"].get(SEND_POST, [])
        for i, t0 in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else t0 + max_ns
            times, t = [], t0
            for name, whose, point in steps[1:]:
                # The send's completion may be published before the receiver completes:
                # it is searched from the leg's start, the others from the step before.
                after = t0 if point == NET_PUBLISHED else t
                found = next((u for u in index[whose].get(point, []) if u >= after), None)
                if found is None or found > min(end, t0 + max_ns):
                    times = None
                    break
                times.append(found)
                if point != NET_PUBLISHED:
                    t = found
            if times:
                out.append([t0] + times)
    return out


def main():
    prefix = sys.argv[1]
    max_ns = int(float(sys.argv[2]) * 1000) if len(sys.argv) > 2 else 1_000_000
    logs = [load(f"{prefix}.{r}.csv") for r in (0, 1)]
    # Steps whose point never occurs (logs of a build older than the step) are left out.
    seen = {p for log in logs for _, p in log}
    steps = [s for s in STEPS if s[2] in seen]
    found = legs(logs, max_ns, steps)
    if not found:
        sys.exit(f"anatomy_net.py: no whole leg in {prefix}.[01].csv (was the build's `anatomy` feature on?)")
    w = csv.writer(sys.stdout)
    w.writerow(["step", "median_us_after_start", "median_us_after_previous_step", "legs"])
    issued = next(k for k, s in enumerate(steps) if s[2] == NET_ISSUED)
    for k, (name, _, point) in enumerate(steps):
        # The send's completion follows MPI's acceptance of it, not the receiver's steps.
        before = issued if point == NET_PUBLISHED else max(k - 1, 0)
        after = statistics.median((leg[k] - leg[0]) / 1000 for leg in found)
        prev = statistics.median((leg[k] - leg[before]) / 1000 for leg in found) if k else 0.0
        w.writerow([name, f"{after:.2f}", f"{prev:.2f}", len(found)])


if __name__ == "__main__":
    main()
