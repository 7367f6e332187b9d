#!/usr/bin/env python3
"""Splits inline Attend round trips into the way in, the serving and the way out.

    trace_join.py SERVER_CSV CLIENT_CSV [LABEL]

SERVER_CSV is the server's DRIFTKV_ATTEND_TRACE file (service/call_trace.h:
arrived_ns, served_ns, finished_ns and, since it has them, phases_ns per
call of the polling door),
CLIENT_CSV a decode_step_bench --trace_calls file (start_ns, end_ns per
timed call); both steady-clock (CLOCK_MONOTONIC) nanoseconds of one host.
A client call is matched with the server call that arrived inside it.
Prints, in microseconds, p50 / p90 / p99 of
  in     arrived - start: the client's send, the transport, gRPC's read
  serve  served - arrived: the serving function (parse, Handler, answer built)
  phases the call's phases: the request's parse and the Handler (with phases_ns)
  beside  serve - phases: the serving outside them (the answer's buffer,
         metrics, the call's objects)
  out    end - served: the answer's send, the transport, the client's read
  sent   finished - served: until the server's send completed
  total  end - start
"""
import csv
import sys
from bisect import bisect_left


def load(path):
    with open(path) as f:
        return [tuple(int(v) for v in row.values()) for row in csv.DictReader(f)]


def q(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")


def main():
    server = sorted(load(sys.argv[1]))
    client = load(sys.argv[2])
    label = sys.argv[3] if len(sys.argv) > 3 else ""
    arrived = [s[0] for s in server]
    timed = len(server[0]) > 3 if server else False
    keys = ("in", "serve", "phases", "beside", "out", "sent", "total") if timed else ("in", "serve", "out", "sent", "total")
    parts = {k: [] for k in keys}
    unmatched = 0
    for start, end in client:
        i = bisect_left(arrived, start)
        if i == len(server) or server[i][0] > end:
            unmatched += 1
            continue
        a, b, c = server[i][:3]
        parts["in"].append((a - start) / 1e3)
        parts["serve"].append((b - a) / 1e3)
        if timed:
            parts["phases"].append(server[i][3] / 1e3)
            parts["beside"].append((b - a - server[i][3]) / 1e3)
        parts["out"].append((end - b) / 1e3)
        parts["sent"].append((c - b) / 1e3)
        parts["total"].append((end - start) / 1e3)
    n = len(parts["total"])
    row = " ".join(f"{k}={q(v, .5):.1f}/{q(v, .9):.1f}/{q(v, .99):.1f}" for k, v in parts.items())
    print(f"{label} calls={n} unmatched={unmatched} us p50/p90/p99: {row}")


if __name__ == "__main__":
    main()
