#!/usr/bin/env bash
# A cluster with every optional protection on: gRPC over mutual TLS (certificates from files, one CA),
# HTTPS on the coordinator, the cluster secret, an API key. Roles are started by hand as a deployment
# would; a completion is served over HTTPS, and a member without a client certificate or without the
# secret cannot join.
. "$(dirname "$0")/lib.sh"
command -v openssl >/dev/null || { echo "openssl missing (scripts/deps.sh installs it)"; exit 1; }
"$S" ckpt init --preset tiny --out "$TMP/ck" --seed 3 >/dev/null 2>&1
C="$TMP/pki"; mkdir -p "$C"; cd "$C" || exit 1
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2 \
  -subj "/CN=strata test CA" >/dev/null 2>&1
mk() { # name: a certificate for 127.0.0.1 / localhost signed by the CA
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=$1" >/dev/null 2>&1
  printf "subjectAltName=IP:127.0.0.1,DNS:localhost\n" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "$1.pem" -days 2 -extfile "$1.ext" >/dev/null 2>&1
}
for n in coord expert attn; do mk $n; done
chmod 600 ./*.key
cd - >/dev/null || exit 1
mkdir -p -m 700 "$STRATA_STATE"
SECRET="$STRATA_STATE/cluster.secret"
(umask 077; openssl rand -hex 32 >"$SECRET")
KEY=tls-key-$$
BINDIR=$(dirname "$S")
ready="$STRATA_STATE/coordinator.ready"
pids=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap 'stop_all; cleanup' EXIT
STRATA_API_KEY=$KEY "$BINDIR/strata-coordinator" --ckpt "$TMP/ck" --grpc 127.0.0.1:0 --http 127.0.0.1:0 --ready-file "$ready" \
  --cluster-secret-file "$SECRET" --tls-cert "$C/coord.pem" --tls-key "$C/coord.key" --tls-ca "$C/ca.pem" \
  --http-tls-cert "$C/coord.pem" --http-tls-key "$C/coord.key" --heartbeat-ms 200 >"$TMP/coord.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do [ -s "$ready" ] && break; sleep 0.1; done
grpc=$(sed -n 's/^grpc=//p' "$ready"); http=$(sed -n 's/^http=//p' "$ready")
check "coordinator starts with TLS on both ports" "[ -n '$grpc' ] && [ -n '$http' ]"
member() { # role name extra...: an expert server or attention worker with mTLS + the secret
  local role=$1 name=$2; shift 2
  "$BINDIR/strata-$role" --coordinator "$grpc" --ckpt "$TMP/ck" --listen 127.0.0.1:0 --name "$name" "$@" \
    >"$TMP/$name.log" 2>&1 &
  pids+=($!)
}
member expert expert-0 --cluster-secret-file "$SECRET" --tls --tls-ca "$C/ca.pem" --tls-cert "$C/expert.pem" --tls-key "$C/expert.key"
member attn attn-0 --cluster-secret-file "$SECRET" --tls --tls-ca "$C/ca.pem" --tls-cert "$C/attn.pem" --tls-key "$C/attn.key"
# intruders: TLS without a client certificate; a client certificate without the secret
member expert intruder-nocert --cluster-secret-file "$SECRET" --tls --tls-ca "$C/ca.pem"
other="$TMP/other.secret"; (umask 077; openssl rand -hex 32 >"$other")
member expert intruder-nosecret --cluster-secret-file "$other" --tls --tls-ca "$C/ca.pem" --tls-cert "$C/expert.pem" --tls-key "$C/expert.key"
ok_ready=0
for _ in $(seq 1 100); do
  curl -sf --cacert "$C/ca.pem" "https://$http/readyz" >/dev/null 2>&1 && { ok_ready=1; break; }
  sleep 0.2
done
check "the cluster becomes ready over HTTPS" "[ $ok_ready = 1 ]"
out=$(curl -s --cacert "$C/ca.pem" -H "Authorization: Bearer $KEY" "https://$http/v1/completions" \
  -d '{"prompt":"hello","max_tokens":4}')
check "a completion is served over HTTPS through mTLS gRPC and the authenticated data plane" \
  "echo '$out' | python3 -c 'import sys,json; j=json.load(sys.stdin); assert j[\"usage\"][\"completion_tokens\"]==4'"
check "plain HTTP gets no answer from the HTTPS port" \
  "! curl -s -m 3 http://$http/healthz | grep -q ok"
check "a request without the API key is 401" \
  "[ \"\$(curl -s -o /dev/null -w '%{http_code}' --cacert $C/ca.pem https://$http/v1/completions -d '{}')\" = 401 ]"
st=$(curl -s --cacert "$C/ca.pem" "https://$http/status")
check "only the two real members joined (no intruder without a client certificate or the secret)" \
  "echo '$st' | python3 -c 'import sys,json; m=json.load(sys.stdin)[\"members\"]; n=sorted(x[\"name\"] for x in m); assert n==[\"attn-0\",\"expert-0\"], n'"
finish
