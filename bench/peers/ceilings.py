#!/usr/bin/env python3
"""Physical ceilings for the CPU rows of `make bench`, measured on this machine.

    bench/peers/ceilings.py [--mib 64] [--repeat 5]

memcpy_gbps        one thread copying a buffer of --mib MiB to another
                   (CPython's bytearray slice assignment is a memcpy): the
                   ceiling of a shared-memory collective, which must copy
                   every byte at least once.
loopback_tcp_gbps  one TCP connection on 127.0.0.1 moving --mib MiB per
                   transfer, a sender and a receiver thread (the kernel's
                   copies dominate, not Python): the ceiling of a collective
                   over TCP on one host.
Medians of --repeat runs after one warm-up. Prints one JSON object.
Standard library only.
"""
import argparse
import json
import socket
import statistics
import threading
import time


def memcpy_gbps(nbytes, repeat):
    src = bytearray(b"\x5a" * nbytes)
    dst = bytearray(nbytes)
    runs = []
    for i in range(repeat + 1):
        start = time.perf_counter()
        dst[:] = src
        took = time.perf_counter() - start
        if i:
            runs.append(nbytes / took / 1e9)
    return statistics.median(runs)


def loopback_gbps(nbytes, repeat):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    payload = memoryview(bytearray(nbytes))
    sink = memoryview(bytearray(1 << 20))

    def send():
        client.sendall(payload)

    runs = []
    for i in range(repeat + 1):
        sender = threading.Thread(target=send)
        start = time.perf_counter()
        sender.start()
        got = 0
        while got < nbytes:
            n = conn.recv_into(sink)
            if n == 0:
                raise RuntimeError("loopback connection closed early")
            got += n
        took = time.perf_counter() - start
        sender.join()
        if i:
            runs.append(nbytes / took / 1e9)
    for s in (client, conn, server):
        s.close()
    return statistics.median(runs)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    nbytes = args.mib << 20
    print(json.dumps({"benchmark": "ceilings", "bytes": nbytes,
                      "memcpy_gbps": memcpy_gbps(nbytes, args.repeat),
                      "loopback_tcp_gbps": loopback_gbps(nbytes, args.repeat)}))


if __name__ == "__main__":
    main()
