#!/bin/sh
# no_tls.sh BINARY: headroom defines no thread-local variables. Every thread of the process carries a
# copy of them (each HTTP connection thread too, touched when the thread starts): the kernels' 1 MiB
# of _Thread_local tile scratch once cost 1 MiB per connection. Lists any it finds.
command -v readelf >/dev/null 2>&1 || { echo "no_tls: readelf (binutils) is absent: skipped"; exit 77; }
[ -x "$1" ] || { echo "no_tls: $1 is not an executable" >&2; exit 1; }
found=$(readelf -sW "$1" | awk '$4 == "TLS" && $7 != "UND" { print $8 " (" $3 " bytes)" }')
if [ -n "$found" ]; then
    echo "no_tls: $1 defines thread-local variables (give them to their owner instead):"
    echo "$found"
    exit 1
fi
echo "no_tls: no thread-local variables in $1"
