#!/usr/bin/env bash
# The etcd store over TLS and with etcd v3 user/password auth (issue 21
# item 2). Makes a CA, a server certificate for 127.0.0.1 and a client
# certificate with openssl, starts a private etcd on 127.0.0.1 with client
# certificate auth, then another with auth enabled (root + a user whose
# role covers only the test's namespace), and runs test_store_tls against
# both: good settings publish and fetch; a missing CA, a missing client
# certificate, plain http to the TLS port, no credentials, a wrong
# password and a namespace outside the user's role do not.
# Usage: etcd_tls.sh TEST_STORE_TLS_BINARY
set -u
bin=$1
etcd=${PDX_ETCD_BIN:-/usr/bin/etcd}
etcdctl=${PDX_ETCDCTL_BIN:-/usr/bin/etcdctl}
for t in "$etcd" "$etcdctl" openssl python3; do
    if ! command -v "$t" >/dev/null; then
        echo "SKIP: $t not installed"; exit 77
    fi
done
dir=$(mktemp -d /tmp/pdx-etcd-tls-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    rm -rf "$dir"
}
trap cleanup EXIT
fail=0
check() { # name expected_rc command...
    local name=$1 want=$2; shift 2
    local out rc
    out=$(timeout 60 "$@" 2>&1); rc=$?
    if [ "$rc" -eq "$want" ]; then
        echo "PASS $name"; echo "$out" | grep -E "^(ok|refused|x:|d:)" | sed 's/^/    /'
    else
        echo "FAIL $name (exit $rc, wanted $want)"; echo "$out" | tail -15 | sed 's/^/    /'
        fail=1
    fi
}
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_ready() { # endpoint etcdctl-flags...
    local ep=$1; shift
    for _ in $(seq 1 150); do
        if ETCDCTL_API=3 "$etcdctl" --endpoints="$ep" --dial-timeout=1s "$@" \
                endpoint health >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    echo "FAIL: etcd at $ep did not come up"; cat "$dir"/*.log | tail -20
    exit 1
}

cd "$dir" || exit 1
# Certificates: CA, server (SAN IP 127.0.0.1), client.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=pdx-test-ca \
    -keyout ca.key -out ca.crt >/dev/null 2>&1 || { echo "FAIL: openssl CA"; exit 1; }
for who in server client; do
    openssl req -newkey rsa:2048 -nodes -subj "/CN=pdx-test-$who" \
        -keyout $who.key -out $who.csr >/dev/null 2>&1
    if [ $who = server ]; then
        printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > $who.ext
    else
        printf 'extendedKeyUsage=clientAuth\n' > $who.ext
    fi
    openssl x509 -req -in $who.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
        -days 2 -extfile $who.ext -out $who.crt >/dev/null 2>&1 \
        || { echo "FAIL: openssl $who"; exit 1; }
done
chmod 600 ./*.key

# 1. TLS with client certificates.
c1=$(free_port); p1=$(free_port)
"$etcd" --name tls --data-dir "$dir/d1" \
    --listen-client-urls https://127.0.0.1:$c1 \
    --advertise-client-urls https://127.0.0.1:$c1 \
    --listen-peer-urls http://127.0.0.1:$p1 \
    --initial-advertise-peer-urls http://127.0.0.1:$p1 \
    --initial-cluster tls=http://127.0.0.1:$p1 \
    --cert-file server.crt --key-file server.key --trusted-ca-file ca.crt \
    --client-cert-auth >"$dir/tls.log" 2>&1 &
pids+=($!)
tls=https://127.0.0.1:$c1
wait_ready $tls --cacert ca.crt --cert client.crt --key client.key
check tls_ok 0 "$bin" ok $tls /pdxtls \
    ca_file=$dir/ca.crt cert_file=$dir/client.crt key_file=$dir/client.key
check tls_no_ca 0 "$bin" fail $tls /pdxtls \
    cert_file=$dir/client.crt key_file=$dir/client.key
check tls_no_client_cert 0 "$bin" fail $tls /pdxtls ca_file=$dir/ca.crt
check tls_plain_http 0 "$bin" fail http://127.0.0.1:$c1 /pdxtls
check tls_cert_without_key 0 "$bin" fail $tls /pdxtls \
    ca_file=$dir/ca.crt cert_file=$dir/client.crt

# 2. User/password auth (plain http on loopback).
c2=$(free_port); p2=$(free_port)
"$etcd" --name auth --data-dir "$dir/d2" \
    --listen-client-urls http://127.0.0.1:$c2 \
    --advertise-client-urls http://127.0.0.1:$c2 \
    --listen-peer-urls http://127.0.0.1:$p2 \
    --initial-advertise-peer-urls http://127.0.0.1:$p2 \
    --initial-cluster auth=http://127.0.0.1:$p2 >"$dir/auth.log" 2>&1 &
pids+=($!)
au=http://127.0.0.1:$c2
wait_ready $au
ctl() { ETCDCTL_API=3 "$etcdctl" --endpoints=$au --dial-timeout=2s "$@" >/dev/null; }
ctl user add root:rootpw-0123 && ctl user add pdxu:pdxpw-4567 &&
ctl role add pdxrole &&
ctl role grant-permission pdxrole readwrite --prefix=true /pdxauth/ &&
ctl user grant-role pdxu pdxrole && ctl auth enable ||
    { echo "FAIL: etcdctl auth setup"; exit 1; }
printf 'pdxpw-4567\n' > pw && chmod 600 pw
printf 'wrong-password\n' > badpw && chmod 600 badpw
check auth_ok 0 "$bin" ok $au /pdxauth user=pdxu password_file=$dir/pw
check auth_no_credentials 0 "$bin" fail $au /pdxauth
check auth_wrong_password 0 "$bin" fail $au /pdxauth user=pdxu password_file=$dir/badpw
# A wrong password is not retried at every request (etcd runs bcrypt on
# each attempt): at most 3 attempts in the 3 s (backoff 1 s, 2 s, ...).
n=$(PDX_LOG_LEVEL=warn timeout 60 "$bin" fail $au /pdxauth user=pdxu \
    password_file=$dir/badpw 2>&1 | grep -c "authentication failed")
if [ "$n" -ge 1 ] && [ "$n" -le 3 ]; then
    echo "PASS auth_backoff ($n attempts in 3 s)"
else
    echo "FAIL auth_backoff: $n authentication attempts in 3 s"; fail=1
fi
check auth_outside_role 0 "$bin" fail $au /other user=pdxu password_file=$dir/pw
check auth_user_without_password 0 "$bin" fail $au /pdxauth user=pdxu
exit $fail
