#!/usr/bin/env python3
"""Merges one `make bench` run (scripts/bench.sh) into a report.

    bench/report.py RAW_DIR [--out latest.json] [--date YYYY-MM-DD]

RAW_DIR holds what scripts/bench.sh wrote: each mesh-bench suite's JSON,
bench/python_bench.py's python.json (Mesh = meshrt, peer = the same C++
calls), the peers' outputs (tcpstore_N_PASS.json, gloo_PASS.jsonl,
mpi_PASS.jsonl), peer_*.json notes and machine.json. Writes every input plus the rows to
--out, and prints ONE Markdown table on stdout:

    | suite | row | Mesh | peer | ratio | note |

ratio is always Mesh / peer. For times and sizes (s, ms, us, ns, bytes) below
1 favours Mesh; for bandwidths (GB/s) above 1 does. Where a suite ran in
several alternating passes the figures are medians over passes, and the
ratio the median of each pass's own ratio. A peer that failed or timed out
at some size shows that as its figure instead of losing the row; a peer that
is not installed gives rows marked "skipped" with the reason.

Standard library only. Exit status 0 even when rows failed (the table says
so); 2 when RAW_DIR is missing or holds no results.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

KIB, MIB = 1 << 10, 1 << 20
TABLE_SIZES = (64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB)
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"unreadable {os.path.basename(path)}: {e}"}


def load_lines(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    rows.append({"error": f"malformed line in {os.path.basename(path)}"})
    return rows


def size_name(b):
    if b >= MIB and b % MIB == 0:
        return f"{b // MIB} MiB"
    if b >= KIB and b % KIB == 0:
        return f"{b // KIB} KiB"
    return f"{b} B"


def median(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def fmt(v):
    if v is None:
        return "—"
    if isinstance(v, str):
        return v
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


class Report:
    def __init__(self, raw):
        self.raw = raw
        self.rows = []
        self.suites = {}

    def add(self, suite, row, mesh, peer, ratio=None, note=""):
        if ratio is None and isinstance(mesh, (int, float)) and isinstance(peer, (int, float)) and peer:
            ratio = mesh / peer
        self.rows.append({"suite": suite, "row": row, "mesh": mesh, "peer": peer,
                          "ratio": ratio, "note": note})

    def files(self, pattern):
        return sorted(glob.glob(os.path.join(self.raw, pattern)))

    def suite(self, name):
        path = os.path.join(self.raw, name + ".json")
        if not os.path.exists(path):
            return None
        data = load(path)
        self.suites[name] = data
        return data

    # ---- suites ---------------------------------------------------------------

    def ping(self):
        p = self.suite("ping")
        if p is None:
            return
        if "error" in p:
            self.add("rpc latency", "coordinator calls", "failed", None, note=p["error"])
            return
        floor = p.get("baseline_health_check", {})
        for key, name in (("kv_get", "KvGet"), ("heartbeat", "Heartbeat"),
                          ("get_server_info", "GetServerInfo")):
            stats = p.get(key)
            if not stats:
                continue
            for q in ("p50", "p99"):
                if key == "get_server_info" and q == "p99":
                    continue
                self.add("rpc latency", f"{name} {q} (µs) vs bare gRPC health Check",
                         stats.get(f"{q}_us"), floor.get(f"{q}_us"),
                         note=f"{stats.get('count')} calls each, alternating blocks; the peer is the floor")

    def rendezvous(self, peer_note):
        peers = {}
        for path in self.files("tcpstore_*_*.json"):
            m = re.search(r"tcpstore_(\d+)_(\d+)\.json$", path)
            if m:
                peers.setdefault(int(m.group(1)), {})[int(m.group(2))] = load(path)
        self.suites["tcpstore_rendezvous"] = {str(n): {str(k): v for k, v in p.items()}
                                              for n, p in peers.items()}
        # Every rank its own connection: ranks calling the coordinator
        # themselves, then through agents (mesh-bench rendezvous --via-agent),
        # plaintext and TLS, each against the same peer runs.
        self.rendezvous_rows("rendezvous", "rendezvous", ", a connection each", peers, peer_note)
        self.rendezvous_rows("rendezvous_agents", "rendezvous_agents",
                             " through agents of 8", peers, peer_note)
        self.rendezvous_rows("rendezvous_agents_tls", "rendezvous_agents_tls",
                             " through agents of 8, TLS", peers, peer_note)

    def rendezvous_rows(self, prefix, suite, how, peers, peer_note):
        by_n = {}
        for path in self.files(prefix + "_*_*.json"):
            m = re.search(prefix + r"_(\d+)_(\d+)\.json$", path)
            if m:
                by_n.setdefault(int(m.group(1)), {})[int(m.group(2))] = ("mesh", load(path))
        self.suites[suite] = {str(n): {str(k): v[1] for k, v in passes.items()}
                              for n, passes in by_n.items()}
        for n in sorted(by_n):
            mesh_runs = {k: v[1] for k, v in by_n[n].items()}
            ok_mesh = {k: r["mesh"]["total_s"] for k, r in mesh_runs.items()
                       if isinstance(r.get("mesh"), dict) and "total_s" in r["mesh"]}
            floor = median(r.get("baseline_health_check", {}).get("total_s") for r in mesh_runs.values())
            mesh = median(ok_mesh.values())
            if mesh is None:
                mesh = "failed"
            row = f"{n} ranks{how}: join + barrier + 128 B ID (s) vs TCPStore, a connection each"
            notes = [f"{len(ok_mesh)} pass(es)"]
            if floor:
                notes.append(f"Mesh's gRPC floor {fmt(floor)} s")
            connect = median(r.get("connect_s") for r in mesh_runs.values())
            if connect is not None:
                notes.append(f"Mesh connected in {fmt(connect)} s before the round")
            if any(r.get("in_process") is False for r in mesh_runs.values()):
                notes.append("coordinator in its own process (mesh-bench serve)")
            if n not in peers:
                if peer_note.startswith("skipped"):
                    self.add("rendezvous", row, mesh, "skipped", note="; ".join(notes + [peer_note]))
                else:
                    self.add("rendezvous", row, mesh, "—", note="; ".join(
                        notes + ["Mesh only: the TCPStore peer runs up to MESH_BENCH_PEER_MAX_RANKS"]))
                continue
            peer_runs = peers[n]
            ok_peer = {k: r["total_s"] for k, r in peer_runs.items() if "total_s" in r and "error" not in r}
            errors = [r["error"] for r in peer_runs.values() if "error" in r]
            peer = median(ok_peer.values())
            paired = [ok_mesh[k] / ok_peer[k] for k in ok_mesh if k in ok_peer and ok_peer[k]]
            ratio = median(paired)
            if peer is None:
                peer = "timed out" if any("timed out" in e or "Timeout" in e for e in errors) else "failed"
            peer_connect = median(r.get("connect_s") for r in peer_runs.values())
            if peer_connect is not None:
                notes.append(f"TCPStore connected in {fmt(peer_connect)} s (plaintext)")
            if any(r.get("server_process") for r in peer_runs.values()):
                notes.append("TCPStore's server in its own process")
            if errors:
                notes.append(f"TCPStore {len(errors)}/{len(peer_runs)} failed: {errors[0][:120]}")
            self.add("rendezvous", row, mesh, peer, ratio, "; ".join(notes))

    def waiters(self):
        w = self.suite("waiters")
        if w is None:
            return
        if "error" in w:
            self.add("waiters", "pending waits", "failed", None, note=w["error"])
            return
        for k in w.get("kinds", []):
            kind = k.get("kind", "?")
            per = k.get("rss_per_wait_bytes")
            self.add("waiters", f"{k.get('ranks')} pending {kind} waits: KiB per wait", per / 1024 if per else None,
                     "—", note=f"Mesh only (no peer holds waits server-side); release {fmt(k.get('release_s'))} s")

    def collectives(self, torch_note, mpi_note):
        def mesh_rows(kind):
            out = {}
            for path in self.files(f"collectives_{kind}_*.json"):
                data = load(path)
                self.suites.setdefault(f"collectives_{kind}", []).append(data)
                for r in data.get("rows", []):
                    out.setdefault((r["op"], r["bytes"]), []).append(r)
            return out

        def peer_rows(prefix, name):
            out = {}
            errors = []
            runs = self.files(f"{prefix}_*.jsonl")
            for path in runs:
                rows = load_lines(path)
                self.suites.setdefault(name, []).append(rows)
                for r in rows:
                    if "op" in r:
                        out.setdefault((r["op"], r["bytes"]), []).append(r)
                    elif "error" in r:
                        errors.append(r["error"])
            return out, errors, bool(runs)

        tcp, shm = mesh_rows("tcp"), mesh_rows("shm")
        gloo, gloo_errors, gloo_ran = peer_rows("gloo", "torch_gloo_collectives")
        mpi, mpi_errors, mpi_ran = peer_rows("mpi", "mpi_collectives")
        sizes = sorted({b for (_, b) in list(tcp) + list(shm)})
        # The sizes where they were run (a smoke run has its own).
        wanted = [b for b in sizes if b in TABLE_SIZES] or sizes
        for op in OPS:
            for b in wanted:
                for mesh_map, peer_map, ran, errors, pnote, label in (
                        (tcp, gloo, gloo_ran, gloo_errors, torch_note, "Mesh TCP vs torch Gloo"),
                        (shm, mpi, mpi_ran, mpi_errors, mpi_note, "Mesh shm vs OpenMPI")):
                    mine = mesh_map.get((op, b), [])
                    if not mine and not peer_map.get((op, b)):
                        continue
                    mesh = median(r.get("busbw_gbps") for r in mine) if mine else "failed"
                    wrong = sum(max(0, r.get("wrong", 0) or 0) for r in mine)
                    theirs = peer_map.get((op, b), [])
                    notes = []
                    if wrong:
                        notes.append(f"Mesh: {wrong} WRONG elements")
                    if not ran:
                        peer = "skipped"
                        notes.append(pnote)
                    elif not theirs and any(o == op and "error" in r[0]
                                            for (o, _), r in peer_map.items()):
                        # The peer stops an op after its first size fails.
                        peer = "unsupported"
                        notes.append(next(r[0]["error"] for (o, _), r in peer_map.items()
                                          if o == op and "error" in r[0])[:120])
                    elif not theirs:
                        peer = "failed"
                        if errors:
                            notes.append(errors[0][:120])
                    elif all("error" in r for r in theirs):
                        peer = "unsupported"
                        notes.append(theirs[0]["error"][:120])
                    else:
                        peer = median(r.get("busbw_gbps") for r in theirs if "error" not in r)
                        pw = sum(max(0, r.get("wrong", 0) or 0) for r in theirs)
                        if pw:
                            notes.append(f"peer: {pw} wrong elements")
                    if len(mine) > 1:
                        notes.append(f"median of {len(mine)} passes")
                    self.add("collectives (2 procs)", f"{op} {size_name(b)} busbw (GB/s), {label}",
                             mesh, peer, note="; ".join(notes))

    def redistribute(self):
        r = self.suite("redistribute")
        if r is None:
            return
        if "error" in r:
            self.add("redistribute", "Redistribute", "failed", None, note=r["error"])
            return
        for row in r.get("rows", []):
            note = f"plan {row.get('plan')}; ratio: median of per-round ratios"
            if row.get("layout_copies"):
                note += (f"; floor (raw + the layout's local copies) {row.get('floor_us', 0):,.0f} µs,"
                         f" Redistribute / floor {row.get('floor_ratio', 0):.2f}")
            if row.get("wrong"):
                note += f"; {row['wrong']} WRONG elements"
            self.add("redistribute",
                     f"{row.get('transition')} mesh {row.get('mesh')} {size_name(row.get('bytes', 0))} (µs) vs raw collectives",
                     row.get("redistribute_us"), row.get("raw_us"), row.get("paired_ratio") or row.get("ratio"), note)

    def launch(self):
        r = self.suite("launch")
        if r is None:
            return
        if "error" in r:
            self.add("launch", "submit to all joined", "failed", None, note=r["error"])
            return
        mesh = r.get("mesh", {}).get("median_s")
        torch = r.get("torchrun", {})
        row = f"{r.get('nproc')} ranks: submit to all joined (s) vs torchrun"
        if "median_s" in torch:
            self.add("launch", row, mesh, torch["median_s"],
                     note=f"median of {r.get('rounds')} alternating rounds")
        else:
            self.add("launch", row, mesh, "skipped", note=f"torchrun: {torch.get('skipped', '?')}")

    def recovery(self):
        r = self.suite("recovery")
        if r is None:
            return
        if "error" in r:
            self.add("recovery", "kill -9 of a rank", "failed", None, note=r["error"])
            return
        row = (f"{r.get('nproc')} ranks, kill -9 of one: survivors' first collective of the new "
               f"epoch (s) vs torchrun's restarted group")
        note = (f"median of {len(r.get('mesh', []))} rounds; replacement back in the mesh "
                f"{r.get('mesh_rejoined_median_s', 0):.3f} s")
        if "torchrun_recovered_median_s" in r:
            self.add("recovery", row, r.get("mesh_recovered_median_s"),
                     r["torchrun_recovered_median_s"], note=note)
        else:
            self.add("recovery", row, r.get("mesh_recovered_median_s"), "skipped",
                     note=f"torchrun: {r.get('torchrun_skipped', '?')}")

    def metrics(self):
        m = self.suite("metrics")
        if m is None:
            return
        if "error" in m:
            self.add("metrics", "/metrics", "failed", None, note=m["error"])
            return
        jobs = m.get("jobs")
        self.add("metrics", f"GET /metrics p50 after {jobs} jobs (µs) vs exposer with 1 gauge",
                 m["scrape"]["p50_us"], m["baseline_scrape"]["p50_us"],
                 note=f"{m.get('families')} families; the peer is the HTTP floor")
        self.add("metrics", f"/metrics body after {jobs} jobs (bytes) vs after 1 job",
                 m.get("scrape_bytes"), m.get("one_job_bytes"),
                 note="no label carries a job id: must stay ~1")
        self.add("metrics", "Counter::Increment (ns) vs std::atomic fetch_add",
                 m.get("increment_ns"), m.get("baseline_increment_ns"), note="one thread, hot child")

    def progress(self):
        p = self.suite("progress")
        if p is None:
            return
        if "error" in p:
            self.add("progress", "progress tracking", "failed", None, note=p["error"])
            return
        self.add("progress", "null all_reduce + Wait (ns), tracked vs bare group",
                 p.get("tracked_ns"), p.get("baseline_ns"),
                 note=f"adds {p.get('added_ns', 0):.0f} ns per collective (target <= 200)")

    def store(self):
        s = self.suite("store")
        if s is None:
            return
        if "error" in s:
            self.add("store", "job store", "failed", None, note=s["error"])
            return
        if "skipped" in s:
            self.add("store", "job store on etcd", "skipped", None, note=s["skipped"])
            return
        b = {x["name"]: x for x in s.get("backends", [])}
        sqlite, etcd = b.get("sqlite"), b.get("etcd")
        if not sqlite or not etcd:
            return
        self.add("store", "submit ack p50 (ms), etcd vs SQLite",
                 etcd["ack"]["p50_us"] / 1000, sqlite["ack"]["p50_us"] / 1000,
                 note=f"etcd: {s.get('etcd', '')}")
        self.add("store", "submit ack p99 (ms), etcd vs SQLite",
                 etcd["ack"]["p99_us"] / 1000, sqlite["ack"]["p99_us"] / 1000,
                 note="target: etcd p99 < 20 ms")
        self.add("store", "creates/s from 8 threads, etcd vs SQLite",
                 etcd.get("concurrent_creates_per_s"), sqlite.get("concurrent_creates_per_s"))
        t = s.get("takeover", {})
        self.add("store", f"leader takeover p50 (s), lease {s.get('lease_s')} s",
                 t.get("p50_us", 0) / 1e6, "—",
                 note=f"max {t.get('max_us', 0) / 1e6:.2f} s over {t.get('count')}; target < 3 s")

    def python(self):
        p = self.suite("python")
        if p is None:
            return
        if "error" in p:
            self.add("python", "meshrt vs C++ calls", "failed", None, note=p["error"])
            return
        s = p.get("store", {})
        target = p.get("targets", {})
        self.add("python", "store set + get, 128 B (µs per pair), meshrt vs C++ client",
                 s.get("python_ns", 0) / 1e3, s.get("cpp_ns", 0) / 1e3, s.get("ratio"),
                 note=f"target ratio <= {target.get('store_ratio', 1.5)}; same mesh::Store; "
                      f"median of {s.get('batches')} alternating batches")
        coll = p.get("all_reduce", {})
        if coll.get("skipped"):
            self.add("python", "all_reduce, meshrt vs C++ call", "skipped", "skipped",
                     note=coll.get("skip_reason", ""))
        for row in coll.get("rows", []):
            self.add("python", f"all_reduce {row['numel']} x float32 sync (µs), meshrt vs C++ call",
                     row["python_ns"] / 1e3, row["cpp_ns"] / 1e3, row.get("ratio"),
                     note=f"adds {row['added_ns'] / 1e3:.2f} µs per call (target <= "
                          f"{target.get('all_reduce_added_us', 5)}); same group and buffer; "
                          f"world of 1")

    def gpu(self):
        n = self.suite("nccl_overhead")
        if n is not None:
            if n.get("skipped") or "error" in n:
                self.add("gpu", "all_reduce per-call overhead vs raw ncclAllReduce", "skipped", "skipped",
                         note=n.get("skip_reason") or n.get("error"))
            for row in n.get("rows", []):
                self.add("gpu", f"all_reduce {size_name(row['bytes'])} per call, pipelined (µs) vs raw NCCL",
                         row["mesh_pipelined"]["p50_us"], row["raw_pipelined"]["p50_us"],
                         note="world size 1")
        d = self.suite("dtensor_pack")
        if d is not None:
            if d.get("skipped") or "error" in d:
                self.add("gpu", "DTensor pack/unpack vs device copy bandwidth", "skipped", "skipped",
                         note=d.get("skip_reason") or d.get("error"))
            for row in d.get("rows", []):
                for kind in ("pack", "unpack"):
                    self.add("gpu", f"DTensor {kind} Shard(1) {size_name(row['bytes'])} (GB/s) vs device copy",
                             row[f"{kind}_gbps"], row["copy_gbps"], note="ratio = fraction of copy bandwidth")

    # ---- output ---------------------------------------------------------------

    def table(self):
        lines = ["| suite | row | Mesh | peer | ratio | note |", "|---|---|---|---|---|---|"]
        for r in self.rows:
            ratio = fmt(r["ratio"]) if isinstance(r["ratio"], (int, float)) else "—"
            lines.append(f"| {r['suite']} | {r['row']} | {fmt(r['mesh'])} | {fmt(r['peer'])} | "
                         f"{ratio} | {r['note'].replace('|', '/')} |")
        return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("raw")
    p.add_argument("--out", help="latest.json to write")
    p.add_argument("--date", default="")
    args = p.parse_args()
    if not os.path.isdir(args.raw) or not glob.glob(os.path.join(args.raw, "*.json")):
        print(f"report.py: no results in {args.raw}", file=sys.stderr)
        return 2
    rep = Report(args.raw)
    machine = load(os.path.join(args.raw, "machine.json")) if os.path.exists(
        os.path.join(args.raw, "machine.json")) else {}
    notes = {}
    for path in rep.files("peer_*.json"):
        d = load(path)
        notes[d.get("peer", os.path.basename(path))] = d.get("note", "")
    torch_note = notes.get("torch", "skipped: torch not checked")
    mpi_note = notes.get("openmpi", "skipped: OpenMPI not checked")
    rep.ping()
    rep.rendezvous(torch_note)
    rep.waiters()
    rep.collectives(torch_note, mpi_note)
    rep.redistribute()
    rep.launch()
    rep.recovery()
    rep.metrics()
    rep.progress()
    rep.store()
    rep.python()
    rep.gpu()
    load_end = os.getloadavg()
    print(f"# Mesh performance report {args.date}".rstrip())
    print()
    print(f"Machine: {machine.get('cores', '?')} cores, {machine.get('cpu', '?')}, "
          f"Linux {machine.get('kernel', '?')}; GPU: {machine.get('gpu') or 'none'}. "
          f"Load average at start {fmt(machine.get('load_average_start', [None])[0])}, "
          f"at end {load_end[0]:.2f}.")
    print(f"Peers: torch {machine.get('torch') or '(none)'} ({torch_note}); "
          f"OpenMPI: {mpi_note}; {machine.get('python', '')}.")
    ceil = rep.suite("ceilings") or {}
    ping = rep.suites.get("ping") or {}
    print(f"Ceilings: memcpy {fmt(ceil.get('memcpy_gbps'))} GB/s (one thread), loopback TCP "
          f"{fmt(ceil.get('loopback_tcp_gbps'))} GB/s (one connection), bare gRPC unary call p50 "
          f"{fmt(ping.get('baseline_health_check', {}).get('p50_us'))} µs.")
    print("ratio = Mesh / peer: for times and sizes below 1 favours Mesh, for GB/s above 1 does.")
    print()
    print(rep.table())
    if args.out:
        doc = {"date": args.date, "machine": machine, "load_average_end": load_end,
               "peers": notes, "rows": rep.rows, "suites": rep.suites}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        print(f"\nwrote {args.out} ({len(rep.rows)} rows)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
