#!/usr/bin/env python3
"""How much of a run's time an ONC RPC server spent answering, from a packet capture.

    rpc-busy.py [--by-procedure] CAPTURE.pcap PORT [PORT...]

CAPTURE is what `tcpdump -i lo -s 200 -w CAPTURE` wrote (Ethernet framing, as on Linux's
loopback; a short snap length is enough: only the record marks and the RPC headers are read,
the rest of each record is followed by its TCP sequence numbers). PORTs are the server's
(NFS, MOUNT). A call is outstanding at the server from the capture time of its record's
last byte to that of its reply's last byte; the server is busy while any call is
outstanding. Prints one line of JSON:

    {"calls": N, "replies": N, "busy_s": S, "answer_s": S, "span_s": S, "lost": N}

busy_s is the union of those intervals; answer_s the union of the parts of them before each
reply's first byte was captured (the rest of busy_s is the replies' transfer: a 1 MiB READ
reply takes the loopback's time to cross, and the client's to take it in, whatever the
server); span_s runs from the first call's first byte to the last reply's last byte; lost
counts streams whose record marks fell outside the captured bytes (then their later calls
are not counted, and busy_s is a lower bound). With --by-procedure, "procedures" maps
"PROGRAM/PROCEDURE" (100003 is NFS, 100005 MOUNT) to [calls, median seconds outstanding,
total seconds outstanding, median seconds before the reply's first byte]. A client that
is never waiting for the server spends (wall time - busy_s) on its own work: no server, however
fast, could make such a run take less; a server that began every reply at once would still
leave (wall time - answer_s).
"""

import json
import statistics
import struct
import sys

ETH_LEN = 14


def packets(path):
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24:
            raise SystemExit(f"{path}: not a pcap file")
        magic = struct.unpack("<I", head[:4])[0]
        if magic in (0xA1B2C3D4, 0xA1B23C4D):
            endian = "<"
        elif magic in (0xD4C3B2A1, 0x4D3CB2A1):
            endian = ">"
            magic = struct.unpack(">I", head[:4])[0]
        else:
            raise SystemExit(f"{path}: not a pcap file (magic {magic:#x})")
        nano = magic == 0xA1B23C4D
        linktype = struct.unpack(endian + "I", head[20:24])[0]
        if linktype != 1:
            raise SystemExit(f"{path}: link type {linktype}, expected Ethernet (1), as `tcpdump -i lo` writes")
        while True:
            rec = f.read(16)
            if len(rec) < 16:
                return
            sec, frac, incl, _orig = struct.unpack(endian + "IIII", rec)
            data = f.read(incl)
            if len(data) < incl:
                return
            yield sec + frac / (1e9 if nano else 1e6), data


def tcp_segment(frame):
    """(src, sport, dst, dport, seq, flags, payload_len, captured_payload) of an IPv4 TCP frame."""
    if len(frame) < ETH_LEN + 20 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[ETH_LEN:]
    ihl = (ip[0] & 0x0F) * 4
    if ip[9] != 6 or len(ip) < ihl + 20:
        return None
    total = struct.unpack(">H", ip[2:4])[0]
    tcp = ip[ihl:]
    sport, dport, seq = struct.unpack(">HHI", tcp[:8])
    flags = tcp[13]
    doff = (tcp[12] >> 4) * 4
    plen = total - ihl - doff
    return ip[12:16], sport, ip[16:20], dport, seq, flags, plen, tcp[doff:]


class Stream:
    """One direction of one connection: where its next record mark is, by sequence number."""

    def __init__(self):
        self.next_mark = None  # sequence number of the next record mark
        self.open = None  # (end_seq, xid, kind, proc) of the record being received
        self.lost = False
        self.cont = None  # (xid, kind, proc) of a record whose last fragment is still to come


def union(intervals):
    """Total length of the union of (start, end) intervals."""
    total = 0.0
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def main():
    args = sys.argv[1:]
    by_proc = bool(args) and args[0] == "--by-procedure"
    if by_proc:
        args = args[1:]
    if len(args) < 2:
        raise SystemExit(__doc__)
    ports = {int(p) for p in args[1:]}
    streams = {}
    calls = {}  # (conn, xid) -> (time the call's last byte was captured, "program/procedure")
    reply_start = {}  # (conn, xid) -> time a reply's first byte was captured
    intervals = []
    answers = []  # (call's last byte, reply's first byte)
    per_proc = {}
    first = last = None
    n_calls = n_replies = 0

    def done(conn, to_server, xid, kind, proc, ts):
        nonlocal last, n_calls, n_replies
        if to_server and kind == 0:
            calls[(conn, xid)] = (ts, proc)
            n_calls += 1
        elif not to_server and kind == 1:
            call = calls.pop((conn, xid), None)
            began = reply_start.pop((conn, xid), ts)
            if call is not None:
                intervals.append((call[0], ts))
                answers.append((call[0], max(call[0], began)))
                per_proc.setdefault(call[1], []).append((ts - call[0], max(0.0, began - call[0])))
                n_replies += 1
                last = ts

    for ts, frame in packets(args[0]):
        seg = tcp_segment(frame)
        if seg is None:
            continue
        src, sport, dst, dport, seq, flags, plen, data = seg
        if dport in ports:
            to_server, conn = True, (src, sport, dport)
        elif sport in ports:
            to_server, conn = False, (dst, dport, sport)
        else:
            continue
        key = (conn, to_server)
        st = streams.get(key)
        if st is None or flags & 0x02:  # a SYN starts the stream afresh
            st = streams[key] = Stream()
            if flags & 0x02:
                st.next_mark = (seq + 1) & 0xFFFFFFFF
                continue
        if plen <= 0 or st.lost:
            continue
        if st.next_mark is None:
            st.next_mark = seq  # joined mid-connection: assume a record starts here
        end = (seq + plen) & 0xFFFFFFFF

        def within(x):  # x in [seq, end) modulo 2^32
            return ((x - seq) & 0xFFFFFFFF) < plen

        if st.open is not None:
            rec_end, xid, kind, proc = st.open
            if within((rec_end - 1) & 0xFFFFFFFF):
                st.open = None
                done(conn, to_server, xid, kind, proc, ts)
        while st.open is None and within(st.next_mark):
            off = (st.next_mark - seq) & 0xFFFFFFFF
            need = 4 if st.cont is not None else 12
            if off + need > len(data):
                st.lost = True
                break
            mark = struct.unpack(">I", data[off:off + 4])[0]
            if st.cont is not None:
                xid, kind, proc = st.cont
            else:
                xid, kind = struct.unpack(">II", data[off + 4:off + 12])
                proc = "?"
                if kind == 0 and off + 28 <= len(data):
                    prog, _vers, number = struct.unpack(">III", data[off + 16:off + 28])
                    proc = f"{prog}/{number}"
            length = mark & 0x7FFFFFFF
            rec_end = (st.next_mark + 4 + length) & 0xFFFFFFFF
            st.next_mark = rec_end
            if first is None and to_server and kind == 0:
                first = ts
            if not to_server and kind == 1 and st.cont is None:
                reply_start[(conn, xid)] = ts
            if not mark & 0x80000000:
                # Not the record's last fragment: the record ends with a later one.
                st.cont = (xid, kind, proc)
                continue
            st.cont = None
            if within((rec_end - 1) & 0xFFFFFFFF):
                done(conn, to_server, xid, kind, proc, ts)
            else:
                st.open = (rec_end, xid, kind, proc)

    busy, answer = union(intervals), union(answers)
    span = (last - first) if first is not None and last is not None else 0.0
    lost = sum(1 for s in streams.values() if s.lost)
    out = {"calls": n_calls, "replies": n_replies, "busy_s": round(busy, 6), "answer_s": round(answer, 6), "span_s": round(span, 6), "lost": lost}
    if by_proc:
        out["procedures"] = {
            k: [len(v), round(statistics.median(o for o, _ in v), 6), round(sum(o for o, _ in v), 6), round(statistics.median(b for _, b in v), 6)]
            for k, v in sorted(per_proc.items(), key=lambda kv: -sum(o for o, _ in kv[1]))
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
