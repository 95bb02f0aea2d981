#!/usr/bin/env bash
# A real one-node Kubernetes 1.20.2 cluster for the `pods` test suite (docs/testing.md, "The
# one-node cluster"): etcd, kube-apiserver (ServiceAccount admission, Node+RBAC authorization),
# kube-controller-manager, kube-scheduler, kube-proxy (iptables) and a kubelet on containerd + runc
# with the CNI bridge/host-local/loopback plugins, every binary from Debian's packages or built
# once from Debian's `kubernetes` source package (.ci/build-kube-apiserver.sh).
#
#   .ci/kube-node.sh start     # idempotent; waits for the node to be Ready (< 60 s warm)
#   .ci/kube-node.sh stop      # stops what start started, removes the pods' containers
#   .ci/kube-node.sh status    # exit 0 when the node is Ready
#   .ci/kube-node.sh import-image ARCHIVE   # an OCI archive into containerd (k8s.io namespace)
#
# It is a cluster of its own, separate from the API-only apiserver of .ci/kube-apiserver.sh
# (whose suite relies on pods that are never scheduled). Addresses:
#   bridge cni0             10.244.0.1/24 (pods 10.244.0.2-254): the node's address for pods;
#                           host services the pods use (PostgreSQL, Redis, S3) listen on it too
#   kube-apiserver          https://10.244.0.1:26443, admin bearer token `node-admin-token`
#                           (system:masters), kubeconfig $NODE_DIR/admin.kubeconfig
#   Service CIDR            10.97.0.0/16 (the `kubernetes` Service is 10.97.0.1:443)
#   etcd                    http://127.0.0.1:32379
#   kubelet                 127.0.0.1:10250 (node name `localhost`)
#   cluster DNS             10.244.0.1:53 UDP (.ci/cluster_dns.py, domain cluster.local)
# State: $NODE_DIR (default /var/tmp/duckgres-ci/kube-node). Binaries: $KAPI_CACHE_DIR.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
D=${NODE_DIR:-/var/tmp/duckgres-ci/kube-node}
BIN=${KAPI_CACHE_DIR:-/var/cache/duckgres-ci/kube}
BRIDGE=cni0
NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.97.0.0/16
SERVICE_IP=10.97.0.1
API_PORT=26443
URL=https://$NODE_IP:$API_PORT
ETCD=http://127.0.0.1:32379
TOKEN=node-admin-token
SOCK=$D/containerd/containerd.sock
PAUSE_IMAGE=localhost/pause:1
export DEBIAN_FRONTEND=noninteractive
log() { printf 'kube-node: %s\n' "$*"; }
# shellcheck source=.ci/pids.sh
. "$HERE/pids.sh"
pid_alive() { pid_ours "$D/$1.pid"; }
api_ready() { curl -sf -m 2 --cacert "$D/pki/ca.crt" -H "Authorization: Bearer $TOKEN" "$URL/readyz" >/dev/null 2>&1; }
kc() { kubectl --kubeconfig "$D/admin.kubeconfig" "$@"; }
node_ready() {
  [ "$(kc get node localhost -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
wait_for() {  # what seconds command...: poll until the command succeeds, or fail naming what
  local what=$1 secs=$2; shift 2
  local end=$(( $(date +%s) + secs ))
  until "$@"; do
    if [ "$(date +%s)" -ge "$end" ]; then log "$what not ready after ${secs}s"; return 1; fi
    sleep 0.5
  done
}
daemon() {  # name command...: start it in its own session unless its pid is alive
  local name=$1; shift
  pid_alive "$name" && return 0
  setsid "$@" >"$D/$name.log" 2>&1 </dev/null &
  pid_write "$D/$name.pid" $! "$1"
}

packages() {
  local need=()
  for cmd in runc:runc containerd:containerd ctr:containerd buildah:buildah busybox:busybox-static \
             conntrack:conntrack iptables:iptables etcd:etcd-server kubectl:kubectl; do
    command -v "${cmd%%:*}" >/dev/null || need+=("${cmd#*:}")
  done
  [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]} (apt)"
    apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null
    apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${need[@]}" >/dev/null
  fi
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    [ -x "$BIN/$b" ] || "$HERE/build-kube-apiserver.sh"
  done
}

network() {  # the bridge the CNI plugin uses, created up front so host services can bind to it
  "$HERE/pod-bridge.sh"
  sysctl -qw net.ipv4.ip_forward=1
  mkdir -p "$D/cni"
  cat >"$D/cni/10-duckgres.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "duckgres-pods", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$D/cni/ipam"}},
  {"type": "loopback"}]}
JSON
}

pki() {  # one CA; the apiserver's serving certificate names every address clients use
  mkdir -p "$D/pki"; cd "$D/pki"
  if [ ! -s ca.crt ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=duckgres-ci-node-ca \
      -keyout ca.key -out ca.crt 2>/dev/null
  fi
  if [ ! -s apiserver.crt ]; then
    openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout apiserver.key \
      -out apiserver.csr 2>/dev/null
    printf 'subjectAltName=IP:%s,IP:%s,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n' \
      "$NODE_IP" "$SERVICE_IP" >san.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile san.ext -out apiserver.crt 2>/dev/null
  fi
  [ -s sa.key ] || { openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null; }
  # One identity per component (system:masters only for the admin used by tests and the kube
  # components; the product's pods use their ServiceAccounts' tokens, checked by RBAC).
  printf '%s,admin,admin,system:masters\n' "$TOKEN" >tokens.csv
  cd - >/dev/null
  cat >"$D/admin.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: node
  cluster: {server: "$URL", certificate-authority: "$D/pki/ca.crt"}
users:
- name: admin
  user: {token: "$TOKEN"}
contexts:
- name: node
  context: {cluster: node, user: admin}
current-context: node
YAML
}

containerd_up() {
  mkdir -p "$D/containerd"
  # A containerd that is not running has no live sandbox: address leases left by a session that
  # was killed (no CNI DEL) would otherwise pile up until the /24 is exhausted.
  pid_alive containerd || rm -rf "$D/cni/ipam"
  cat >"$D/containerd/config.toml" <<TOML
version = 2
root = "$D/containerd/root"
state = "$D/containerd/state"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Our machines refuse lowering oom_score_adj (runc fails "can't get final child's PID").
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$D/cni"
TOML
  daemon containerd containerd --config "$D/containerd/config.toml"
  wait_for containerd 30 ctr --address "$SOCK" version >/dev/null 2>&1
}

pause_image() {  # the sandbox image, made locally (no registry): busybox-static sleeping forever
  ctr --address "$SOCK" -n k8s.io images ls -q | grep -qx "$PAUSE_IMAGE" && return 0
  local c archive=$D/pause.oci.tar
  c=$(buildah from scratch)
  buildah copy "$c" "$(command -v busybox)" /bin/busybox >/dev/null
  buildah config --entrypoint '["/bin/busybox", "sleep", "2147483647"]' "$c"
  buildah commit -q --rm "$c" "$PAUSE_IMAGE" >/dev/null
  rm -f "$archive"
  buildah push -q "$PAUSE_IMAGE" "oci-archive:$archive:$PAUSE_IMAGE"
  ctr --address "$SOCK" -n k8s.io images import "$archive" >/dev/null
  log "sandbox image $PAUSE_IMAGE imported"
}

control_plane() {
  mkdir -p "$D/etcd"
  daemon etcd etcd --name node --data-dir "$D/etcd" \
    --listen-client-urls "$ETCD" --advertise-client-urls "$ETCD" \
    --listen-peer-urls http://127.0.0.1:32380 --initial-advertise-peer-urls http://127.0.0.1:32380 \
    --initial-cluster node=http://127.0.0.1:32380 --unsafe-no-fsync=true
  wait_for etcd 30 curl -sf -m 2 "$ETCD/health" -o /dev/null
  daemon apiserver "$BIN/kube-apiserver" --etcd-servers="$ETCD" \
    --bind-address="$NODE_IP" --secure-port="$API_PORT" --advertise-address="$NODE_IP" \
    --tls-cert-file="$D/pki/apiserver.crt" --tls-private-key-file="$D/pki/apiserver.key" \
    --client-ca-file="$D/pki/ca.crt" --token-auth-file="$D/pki/tokens.csv" \
    --authorization-mode=Node,RBAC \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$D/pki/sa.pub" --service-account-signing-key-file="$D/pki/sa.key" \
    --api-audiences=https://kubernetes.default.svc \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --kubelet-preferred-address-types=Hostname --enable-priority-and-fairness=false
  wait_for kube-apiserver 90 api_ready
  kcfg=$D/admin.kubeconfig
  daemon controller-manager "$BIN/kube-controller-manager" --kubeconfig="$kcfg" \
    --leader-elect=false --controllers='*' --service-account-private-key-file="$D/pki/sa.key" \
    --root-ca-file="$D/pki/ca.crt" --use-service-account-credentials=false \
    --port=0 --secure-port=10267 --bind-address=127.0.0.1 \
    --node-monitor-grace-period=20s --pod-eviction-timeout=30s
  daemon scheduler "$BIN/kube-scheduler" --kubeconfig="$kcfg" --leader-elect=false \
    --port=0 --secure-port=10269 --bind-address=127.0.0.1
}

node() {
  mkdir -p "$D/kubelet"
  # The cluster DNS (no CoreDNS image here): Service and StatefulSet-pod names, the rest relayed.
  daemon dns python3 "$HERE/cluster_dns.py" --listen "$NODE_IP" --kubeconfig="$D/admin.kubeconfig"
  daemon kubelet "$BIN/kubelet" --kubeconfig="$D/admin.kubeconfig" \
    --cluster-dns="$NODE_IP" --cluster-domain=cluster.local \
    --container-runtime=remote --container-runtime-endpoint="unix://$SOCK" \
    --pod-infra-container-image="$PAUSE_IMAGE" \
    --fail-swap-on=false --cgroup-driver=cgroupfs --cgroups-per-qos=false \
    --enforce-node-allocatable= --eviction-hard= --image-gc-high-threshold=100 \
    --image-gc-low-threshold=99 --root-dir="$D/kubelet" --hostname-override=localhost \
    --address=127.0.0.1 --read-only-port=0 --max-pods=60 --serialize-image-pulls=false
  daemon kube-proxy "$BIN/kube-proxy" --kubeconfig="$D/admin.kubeconfig" --proxy-mode=iptables \
    --masquerade-all --cluster-cidr="$POD_CIDR" --hostname-override=localhost \
    --conntrack-max-per-core=0 --metrics-bind-address=127.0.0.1:10259 \
    --healthz-bind-address=127.0.0.1:10266
  wait_for "node localhost" 60 node_ready
}

start() {
  local t0; t0=$(date +%s)
  if api_ready && node_ready && pid_alive kube-proxy && pid_alive dns; then
    log "already running at $URL"; return 0
  fi
  # A node started before the cluster DNS existed: its kubelet lacks --cluster-dns; restart it.
  if pid_alive kubelet && ! pid_alive dns; then kill "$(head -n 1 "$D/kubelet.pid")"; rm -f "$D/kubelet.pid"; fi
  mkdir -p "$D"
  packages
  network
  pki
  containerd_up
  pause_image
  control_plane
  node
  log "ready at $URL: node localhost Ready in $(( $(date +%s) - t0 )) s"
}

stop() {
  if [ -S "$SOCK" ]; then  # the pods' containers outlive the kubelet: remove them
    for t in $(ctr --address "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$SOCK" -n k8s.io tasks kill -s KILL "$t" >/dev/null 2>&1 || true
    done
  fi
  for name in kube-proxy kubelet dns scheduler controller-manager apiserver etcd containerd; do
    if pid_alive "$name"; then kill "$(head -n 1 "$D/$name.pid")" && log "stopped $name"; fi
    rm -f "$D/$name.pid"
  done
}

case ${1:-start} in
  start) start ;;
  stop) stop ;;
  status) if api_ready && node_ready; then log "node Ready at $URL"; else log "not running"; exit 1; fi ;;
  import-image)
    [ -s "${2:-}" ] || { echo "usage: $0 import-image ARCHIVE" >&2; exit 2; }
    ctr --address "$SOCK" -n k8s.io images import "$2" >/dev/null && log "imported $2" ;;
  *) echo "usage: $0 start|stop|status|import-image ARCHIVE" >&2; exit 2 ;;
esac
