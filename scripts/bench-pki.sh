#!/usr/bin/env bash
# A throw-away PKI for `mesh-bench rendezvous --tls-*` and `mesh-bench serve
# --tls-*`: a private CA and a server certificate for localhost/127.0.0.1,
# EC P-256 keys, valid for 30 days.
#
#   scripts/bench-pki.sh DIR
#
# Writes DIR/ca.crt, DIR/ca.key, DIR/server.crt and DIR/server.key (DIR is
# created 0700; existing files are replaced). Needs openssl.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: scripts/bench-pki.sh DIR" >&2; exit 2; }
command -v openssl >/dev/null || { echo "bench-pki.sh: openssl not found" >&2; exit 1; }
mkdir -p -m 0700 "$1"
cd "$1"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
  -subj "/CN=mesh-bench-ca" -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
  -keyout server.key -out server.csr 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' \
  >server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
  -extfile server.ext -out server.crt 2>/dev/null
rm -f server.csr server.ext ca.srl
