#!/bin/bash
# haproxy_smuggle.sh HEADROOM: request smuggling through HAProxy with the shipped configuration
# (deploy/haproxy.cfg.in, both frontends) in front of one `headroom serve` (the demo model).
# Each attack hides a POST /v1/completions where a front end and a back end that disagreed on the
# framing would split it off as a request of its own: two Content-Lengths, Content-Length with
# Transfer-Encoding (both orders), a coding other than chunked, whitespace before the colon, a
# negative length, Transfer-Encoding in HTTP/1.0, a folded Transfer-Encoding. Checked: headroom
# answers each attack connection at most once (its answers carry X-Headroom-Replica; HAProxy may add
# its own 400 for bytes it takes as a next request), no completion comes back, and the server never
# generated: its headroom_prompt_tokens_total stays 0 while a plain request through the proxy works.
# Needs haproxy and python3 (exits 77 without them).
set -u
bin=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
command -v haproxy > /dev/null || { echo "SKIP: haproxy is absent (apt-get install haproxy)"; exit 77; }
command -v python3 > /dev/null || { echo "SKIP: python3 is absent"; exit 77; }
tmp=$(mktemp -d)
spid=
hpid=
cleanup() {
    [ -n "$spid" ] && kill "$spid" 2> /dev/null
    [ -n "$hpid" ] && kill "$hpid" 2> /dev/null
    wait 2> /dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$bin" serve --port 0 -t 1 > "$tmp/serve.out" 2> "$tmp/serve.err" &
spid=$!
url=
for _ in $(seq 300); do # bounded: 60 s
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/serve.out" 2> /dev/null | head -1)
    [ -n "$url" ] && curl -sf "$url/health" > /dev/null && break
    url=
    sleep 0.2
done
[ -n "$url" ] || { echo "headroom serve did not start" >&2; cat "$tmp/serve.err" >&2; exit 1; }
sport=${url##*:}
hport=$(free_port)
rrport=$(free_port)
python3 - "$here/deploy/haproxy.cfg.in" "$tmp/haproxy.cfg" "$hport" "$rrport" "$sport" << 'PY'
import sys
s = open(sys.argv[1]).read()
s = s.replace("@BIND@", "127.0.0.1").replace("@PORT_HASH@", sys.argv[3]).replace("@PORT_RR@", sys.argv[4])
s = s.replace("@FACTOR@", "125").replace("@SERVERS@\n", "    server r0 127.0.0.1:%s maxconn 64\n" % sys.argv[5])
open(sys.argv[2], "w").write(s)
PY
haproxy -c -f "$tmp/haproxy.cfg" > /dev/null || { echo "haproxy rejects the configuration" >&2; exit 1; }
haproxy -db -f "$tmp/haproxy.cfg" > "$tmp/haproxy.log" 2>&1 &
hpid=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$hport/health" > /dev/null && break; sleep 0.2; done

python3 - "$hport" "$rrport" "$sport" << 'PY'
import json, re, socket, sys, time
hport, rrport, sport = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
inner = b'{"prompt":"smuggled","max_tokens":1}'
smuggled = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(inner), inner)
chunk = b"%x\r\n%s\r\n0\r\n\r\n" % (len(smuggled), smuggled)
h = b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
attacks = {
    "two Content-Lengths": h + b"Content-Length: 0\r\nContent-Length: %d\r\n\r\n" % len(smuggled) + smuggled,
    "Content-Length then chunked": h + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk,
    "chunked then Content-Length": h + b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" + chunk,
    "Content-Length with chunked at 0": h + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" % (5 + len(smuggled)) + smuggled,
    "coding xchunked": h + b"Content-Length: 0\r\nTransfer-Encoding: xchunked\r\n\r\n" + chunk,
    "space before the colon": h + b"Content-Length: 0\r\nTransfer-Encoding : chunked\r\n\r\n" + chunk,
    "negative length": h + b"Content-Length: -1\r\n\r\n" + smuggled,
    "Transfer-Encoding in HTTP/1.0": b"POST /tokenize HTTP/1.0\r\nHost: x\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk,
    "folded Transfer-Encoding": h + b"Content-Length: 0\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n" + chunk,
}
failed = 0
def exchange(port, data):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(data)
    out, end = b"", time.time() + 3
    s.settimeout(0.5)
    while time.time() < end:
        try:
            b = s.recv(65536)
        except socket.timeout:
            continue
        if not b:
            break
        out += b
    s.close()
    return out
for port, front in ((hport, "prefix_aware"), (rrport, "round_robin")):
    for name, data in attacks.items():
        out = exchange(port, data)
        statuses = [m.decode() for m in re.findall(rb"HTTP/1\.[01] (\d{3}) ", out)]
        ours = out.lower().count(b"x-headroom-replica:")
        ok = len(statuses) >= 1 and ours <= 1 and b"text_completion" not in out
        print("%s %s / %s: statuses %s, %d from headroom" % ("ok:" if ok else "CHECK failed:", front, name,
                                                              ",".join(statuses), ours))
        failed |= not ok
def metric(name):
    body = exchange(sport, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").decode(errors="replace")
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return -1
tokens = metric("headroom_prompt_tokens_total")
print("%s the server generated nothing: headroom_prompt_tokens_total %g" % ("ok:" if tokens == 0 else "CHECK failed:", tokens))
failed |= tokens != 0
good = exchange(hport, h + b"Content-Length: 16\r\nConnection: close\r\n\r\n{\"content\":\"hi\"}")
ok = good.startswith(b"HTTP/1.1 200") and b'"tokens":[' in good
print("%s a plain request through the proxy: %s" % ("ok:" if ok else "CHECK failed:", good[:40]))
failed |= not ok
sys.exit(1 if failed else 0)
PY
rc=$?
[ $rc -eq 0 ] || tail -20 "$tmp/haproxy.log" >&2
exit $rc
