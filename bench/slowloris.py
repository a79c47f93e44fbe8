#!/usr/bin/env python3
"""slowloris.py: the issue-28 attacks against a running `headroom serve` on loopback.

    bench/slowloris.py PORT N slow|idle SECONDS

N attacker connections from 127.0.0.2 and 127.0.0.3 (loopback aliases): `slow` sends a request
line and one header, then a byte every 2 s; `idle` sends nothing. Every 2 s a real client on
127.0.0.1 asks for a 4-token completion. Prints the real client's worst time, and how many attacker
connections the server closed and when the last one was closed (seconds since the attack began).
Needs a descriptor limit above N (ulimit -n)."""
import socket
import sys
import time

port, n, mode, duration = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
attackers = []
for i in range(n):
    s = socket.socket()
    s.setblocking(False)
    s.bind(("127.0.0.%d" % (2 + i % 2), 0))
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    attackers.append(s)
time.sleep(0.3)


def real_request():
    t = time.time()
    c = socket.create_connection(("127.0.0.1", port), timeout=60)
    body = b'{"prompt":"Once upon a time","max_tokens":4}'
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    answer = b""
    while True:
        got = c.recv(65536)
        if not got:
            break
        answer += got
    c.close()
    return time.time() - t, answer.startswith(b"HTTP/1.1 200")


t0 = time.time()
worst, failures, closed_at = 0.0, 0, {}
while time.time() - t0 < duration:
    for i, s in enumerate(attackers):
        if i in closed_at:
            continue
        try:
            if mode == "slow":
                s.send(b"X" if time.time() - t0 > 0.5 else b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            try:
                if not s.recv(100):
                    closed_at[i] = time.time() - t0
            except BlockingIOError:
                pass
        except OSError:
            closed_at[i] = time.time() - t0
    dt, ok = real_request()
    worst = max(worst, dt)
    failures += not ok
    time.sleep(2)
times = sorted(closed_at.values())
print("%s x %d: real completion worst %.3f s (%d not 200); attackers closed %d of %d, the last at %.1f s"
      % (mode, n, worst, failures, len(times), n, times[-1] if times else -1))
