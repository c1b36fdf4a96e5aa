#!/bin/sh
# make_certs.sh DIR: the certificates of doc/security.md's recipe, for the
# mTLS tests: a CA (ca.pem), the coordinator's certificate (coordinator.pem,
# SAN localhost and 127.0.0.1), node certificates n1 and n2 (CN and SAN =
# node id), an admin certificate (CN ckpt-admin), a relay's certificate
# (relay.pem, CN ckpt-relay, SAN localhost and 127.0.0.1), and from a second,
# unrelated CA (other-ca.pem) a certificate for n1 (n1-other.pem).
# Keys are P-256 (<name>.key); everything is valid for one day.
set -eu
dir=$1
mkdir -p "$dir"
cd "$dir"

ca() {  # ca NAME CN
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -keyout "$1.key" -out "$1.pem" -subj "/CN=$2" 2>/dev/null
}
cert() {  # cert NAME CA CN SAN
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$3" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 1 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

ca ca ckpt-test-ca
ca other-ca ckpt-other-ca
cert coordinator ca ckpt-coordinator "DNS:localhost,IP:127.0.0.1"
cert n1 ca n1 "DNS:n1"
cert n2 ca n2 "DNS:n2"
cert admin ca ckpt-admin "DNS:ckpt-admin"
cert relay ca ckpt-relay "DNS:localhost,IP:127.0.0.1,DNS:ckpt-relay"
cert n1-other other-ca n1 "DNS:n1"
