#!/usr/bin/env python3
"""Every anatomy point of a ping-pong leg across nodes, in time order, for any protocol
(eager, pushed rendezvous, staged pieces), where bench/gpu/anatomy_net.py knows only the
eager leg's fixed steps.

A leg runs from one rank's isend (x) to the other rank's next isend (y answers). Each
point is named by whose (x or y), its name and its occurrence k within the leg (the 2nd
STAGE_COPY_ISSUED of x, ...); the table gives the median time after the leg's start and
in how many legs it occurred, sorted by that median.

Usage: anatomy_trace.py PREFIX [MIN_SHARE]   (PREFIX.0.csv, PREFIX.1.csv from
GPULMT_ANATOMY_OUT; rows found in fewer than MIN_SHARE of the legs, default 0.5, left out)
"""
import bisect
import csv
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "gpu"))
from anatomy_points import POINT, PROBE  # noqa: E402  (the numbers, from transport/src/anatomy.rs)

# How the points read in the table, by their names in anatomy.rs; one it adds shows by its name.
POINT_NAMES = {"SendPost": "isend entered", "RecvPost": "irecv entered", "PacketIn": "packet from a ring",
               "PacketOut": "packet out", "CopyIssue": "copy issue", "CopyIssued": "copy issued",
               "CopyDone": "copy seen done", "Completed": "request completed", "NetTaken": "proxy took packet",
               "NetIssued": "proxy: MPI accepted a send", "NetArrived": "proxy: ctrl arrived",
               "NetPublished": "proxy: completions published", "NetPacketIn": "context took a net packet"}
PROBE_NAMES = {"RECV_CLASSIFIED": "irecv classified", "RECV_DESCRIBED": "irecv described",
               "RECV_POSTED": "irecv posted", "SEND_OFFER_WAITED": "isend offer waited",
               "SEND_POSTED": "isend posted", "SEND_PAYLOAD_STAGED": "isend payload staged",
               "RECV_PAYLOAD_COPY": "payload copy-in starts", "RECV_PAYLOAD_WRITTEN": "payload landed",
               "SEND_CLASSIFIED": "isend classified", "COPY_WAIT_ISSUED": "waited copy issued",
               "COPY_WAIT_DONE": "waited copy done", "NET_SEND_CALL": "proxy: MPI_Isend called",
               "NET_HANDED_OVER": "proxy: handed over", "STAGE_COPY_ISSUED": "proxy: staging copy issued",
               "STAGE_COPY_DONE": "proxy: staging copy done", "PIECE_ON_WIRE": "proxy: piece to the network",
               "PIECE_LANDED": "proxy: piece's net op reported", "PACKET_HANDLED": "packet handled",
               "SHIM_ENVELOPE_SENT": "shim: envelope sent", "SHIM_ENVELOPE_MATCHED": "shim: envelope matched",
               "SHIM_RECV_STARTED": "shim: receive started", "SHIM_OP_FINISHED": "shim: op finished"}
POINTS = {n: POINT_NAMES.get(k, k) for k, n in POINT.items()}
PROBES = {n: PROBE_NAMES.get(k, k) for k, n in PROBE.items()}
OPS = {1: "CTRL", 2: "SEND", 3: "RECV"}


def name(p, a):
    if p == POINT["Probe"]:
        return PROBES.get(a, f"probe {a}")
    if p == POINT["NetTaken"]:
        return f"{POINTS[p]} ({OPS.get(a, a)})"
    return POINTS.get(p, f"point {p}")


def load(path):
    with open(path) as f:
        return [(int(r["ns"]), name(int(r["point"]), int(r["arg"]))) for r in csv.DictReader(f)]


def main():
    prefix = sys.argv[1]
    min_share = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
    logs = [load(f"{prefix}.{r}.csv") for r in (0, 1)]
    times_of = [[t for t, _ in log] for log in logs]
    offsets = defaultdict(list)
    legs = 0
    for x in (0, 1):
        y = 1 - x
        starts_x = [t for t, n in logs[x] if n == "isend entered"]
        starts_y = [t for t, n in logs[y] if n == "isend entered"]
        j = 0
        for t0 in starts_x:
            while j < len(starts_y) and starts_y[j] <= t0:
                j += 1
            if j == len(starts_y):
                break
            t1 = starts_y[j]
            legs += 1
            seen = defaultdict(int)
            for who, log, times in (("x", logs[x], times_of[x]), ("y", logs[y], times_of[y])):
                for t, n in log[bisect.bisect_left(times, t0):bisect.bisect_left(times, t1)]:
                    k = seen[(who, n)]
                    seen[(who, n)] += 1
                    offsets[(who, n, k)].append((t - t0) / 1000)
            offsets[("y", "next isend (leg ends)", 0)].append((t1 - t0) / 1000)
    rows = [(statistics.median(v), who, n, k, len(v)) for (who, n, k), v in offsets.items()
            if len(v) >= min_share * legs]
    rows.sort()
    w = csv.writer(sys.stdout)
    w.writerow(["median_us", "whose", "point", "occurrence", "legs_with_it", "legs"])
    for m, who, n, k, c in rows:
        w.writerow([f"{m:.2f}", who, n, k, c, legs])


if __name__ == "__main__":
    main()
