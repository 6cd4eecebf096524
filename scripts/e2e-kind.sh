#!/usr/bin/env bash
# End-to-end check of the multilane operator on a local kind cluster.
#
# NOT run by CI or by scripts/test.sh: it needs a Docker engine (plus kind >= 0.24, kubectl and a
# helm v3/v4 binary), which the development machines of this repository do not have. tests/chart
# only checks that this script parses (bash -n).
#
# What it does:
#   1. creates a kind cluster (kind >= 0.24 enforces NetworkPolicy, so the chart's policies are live);
#   2. builds the multilane image from ./Dockerfile and loads it into the cluster;
#   3. installs a single-node Kafka (apache/kafka, KRaft mode: one pod is broker and controller; no
#      operator, no persistence: a throwaway broker for the test) and creates the input topic;
#   4. installs the chart (charts/multilane) with the freshly built image;
#   5. applies a ParallelConsumer that runs multilane's test processor (5 ms of work per record);
#   6. produces a burst with `multilane loadgen` from a pod, prints `kubectl get pc` snapshots and
#      checks that capacity (replicas x factor) went up, the lag was cleared, and capacity came back down;
#   7. deletes the cluster (KEEP=1 keeps it for inspection).
#
# Scenario names (shared with the emulated-cluster tests, docs/operator.md "End to end through the
# operator"): this script runs only `burst`. `scale-up-down`, `kill-learning`, `kill-releasing`,
# `kill-promoting`, `operator-restart`, `lease-lost` and `chart-operator` run against the emulated API
# server with real worker processes (tests/operator/test_k8s_*.py); they are not in this script yet,
# and this script does not apply the delivery checkers to the processors' logs (it checks scaling only).
#
# Usage: scripts/e2e-kind.sh            (settings below can be overridden from the environment)
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${CLUSTER:-multilane-e2e}
IMAGE=${IMAGE:-multilane:e2e}
KAFKA_IMAGE=${KAFKA_IMAGE:-apache/kafka:3.9.0}
NS=${NS:-e2e}
OPERATOR_NS=${OPERATOR_NS:-multilane-system}
TOPIC=${TOPIC:-orders}
PARTITIONS=${PARTITIONS:-4}
RECORDS=${RECORDS:-300000}
SLEEP_MS=${SLEEP_MS:-5}
TIMEOUT_UP=${TIMEOUT_UP:-600}     # seconds to observe the scale-up
TIMEOUT_DOWN=${TIMEOUT_DOWN:-1200} # seconds to observe lag 0 and the scale-down
KEEP=${KEEP:-0}
BOOTSTRAP="kafka.kafka.svc.cluster.local:9092"

log() { printf '\n==> %s\n' "$*"; }
die() { printf 'e2e-kind: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "needs '$1' on PATH"; }

for tool in docker kind kubectl helm; do need "$tool"; done
docker info >/dev/null 2>&1 || die "no Docker engine reachable (docker info failed)"

WATCH_PID=""
cleanup() {
  local code=$?
  if [ -n "$WATCH_PID" ]; then kill "$WATCH_PID" 2>/dev/null || true; fi
  if [ "$code" -ne 0 ]; then
    log "failed (exit $code): diagnostics"
    kubectl get pc,sts,pods -n "$NS" -o wide 2>/dev/null || true
    kubectl describe pc -n "$NS" 2>/dev/null | tail -n 40 || true
    kubectl logs -n "$OPERATOR_NS" deployment/multilane --tail=100 2>/dev/null || true
  fi
  if [ "$KEEP" = "1" ]; then
    log "KEEP=1: cluster $CLUSTER kept (kind delete cluster --name $CLUSTER)"
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  exit "$code"
}
trap cleanup EXIT

# jsonpath of the ParallelConsumer, empty when unset
pc() { kubectl get pc orders -n "$NS" -o "jsonpath=$1" 2>/dev/null || true; }
capacity() {
  local r f
  r=$(pc '{.status.replicas}'); f=$(pc '{.status.factor}')
  echo $(( ${r:-0} * ${f:-0} ))
}
snapshot() {
  printf '%s  ' "$(date -u +%H:%M:%S)"
  kubectl get pc orders -n "$NS" --no-headers \
    -o custom-columns=READY:'.status.conditions[?(@.type=="Ready")].status',REPLICAS:.status.replicas,FACTOR:.status.factor,LAG:.status.lag,REASON:.status.lastDecision.reason \
    2>/dev/null || echo "(not yet)"
}

log "1. kind cluster $CLUSTER"
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --wait 180s
fi
kubectl cluster-info --context "kind-$CLUSTER" >/dev/null

log "2. build and load $IMAGE"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"
docker pull -q "$KAFKA_IMAGE" >/dev/null
kind load docker-image "$KAFKA_IMAGE" --name "$CLUSTER"

log "3. single-node Kafka ($KAFKA_IMAGE, KRaft) and topic $TOPIC ($PARTITIONS partitions)"
kubectl create namespace kafka --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -n kafka -f - <<EOF
apiVersion: v1
kind: Service
metadata:
  name: kafka
spec:
  selector: {app: kafka}
  ports: [{name: client, port: 9092, targetPort: 9092}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: kafka
spec:
  serviceName: kafka
  replicas: 1
  selector:
    matchLabels: {app: kafka}
  template:
    metadata:
      labels: {app: kafka}
    spec:
      containers:
        - name: kafka
          image: $KAFKA_IMAGE
          imagePullPolicy: IfNotPresent
          ports: [{containerPort: 9092}, {containerPort: 9093}]
          env:
            - {name: KAFKA_NODE_ID, value: "1"}
            - {name: KAFKA_PROCESS_ROLES, value: "broker,controller"}
            - {name: KAFKA_LISTENERS, value: "PLAINTEXT://:9092,CONTROLLER://:9093"}
            - {name: KAFKA_ADVERTISED_LISTENERS, value: "PLAINTEXT://$BOOTSTRAP"}
            - {name: KAFKA_CONTROLLER_LISTENER_NAMES, value: CONTROLLER}
            - {name: KAFKA_LISTENER_SECURITY_PROTOCOL_MAP, value: "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"}
            - {name: KAFKA_CONTROLLER_QUORUM_VOTERS, value: "1@localhost:9093"}
            - {name: KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR, value: "1"}
            - {name: KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR, value: "1"}
            - {name: KAFKA_TRANSACTION_STATE_LOG_MIN_ISR, value: "1"}
            - {name: KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS, value: "0"}
            - {name: KAFKA_NUM_PARTITIONS, value: "$PARTITIONS"}
          readinessProbe:
            tcpSocket: {port: 9092}
            periodSeconds: 5
          resources:
            requests: {cpu: 250m, memory: 768Mi}
EOF
kubectl rollout status -n kafka statefulset/kafka --timeout=300s
kubectl exec -n kafka kafka-0 -- /opt/kafka/bin/kafka-topics.sh --bootstrap-server localhost:9092 \
  --create --if-not-exists --topic "$TOPIC" --partitions "$PARTITIONS" --replication-factor 1

log "4. helm install the chart (image $IMAGE)"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -
helm upgrade --install multilane charts/multilane \
  --namespace "$OPERATOR_NS" --create-namespace \
  --set fullnameOverride=multilane \
  --set image.repository="${IMAGE%%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --set "networkPolicy.namespaces={$NS}" \
  --wait --timeout 5m
kubectl get crd parallelconsumers.multilane.dev >/dev/null
kubectl rollout status -n "$OPERATOR_NS" deployment/multilane --timeout=180s

log "5. ParallelConsumer orders in $NS"
kubectl apply -n "$NS" -f - <<EOF
apiVersion: multilane.dev/v1alpha1
kind: ParallelConsumer
metadata:
  name: orders
spec:
  kafka:
    bootstrapServers: $BOOTSTRAP
    topics: [$TOPIC]
    consumerGroup: orders-e2e
  workload:
    image: $IMAGE
    imagePullPolicy: Never
    processor: multilane.testing.processors:logging_async
    env:
      - {name: MULTILANE_TEST_SLEEP_MS, value: "$SLEEP_MS"}
    resources:
      requests: {cpu: 100m, memory: 256Mi}
      limits: {memory: 512Mi}
  scaling:
    minReplicas: 1
    maxReplicas: $PARTITIONS
    minFactor: 1
    maxFactor: 16
    targetCatchUpSeconds: 60
    scaleDownDelaySeconds: 60
    stabilisationSeconds: 20
    intervalSeconds: 5
EOF
kubectl wait -n "$NS" --for=condition=Ready pc/orders --timeout=300s
kubectl get pc -n "$NS"
BASE=$(capacity)
[ "$BASE" -ge 1 ] || die "no capacity reported before the burst (replicas x factor = $BASE)"
echo "capacity before the burst: $BASE (replicas x factor)"

# `kubectl get pc -w` in the background, for the log
kubectl get pc -n "$NS" -w >"${TMPDIR:-/tmp}/multilane-e2e-watch.log" 2>&1 &
WATCH_PID=$!

log "6. scenario burst: $RECORDS records with multilane loadgen"
kubectl run loadgen -n "$NS" --image="$IMAGE" --image-pull-policy=Never --restart=Never -- \
  loadgen --bootstrap-servers "$BOOTSTRAP" --topic "$TOPIC" --records "$RECORDS" --keys 10000
kubectl wait -n "$NS" --for=jsonpath='{.status.phase}'=Succeeded pod/loadgen --timeout=300s

echo "waiting up to ${TIMEOUT_UP}s for a scale-up"
PEAK=$BASE
deadline=$(( $(date +%s) + TIMEOUT_UP ))
while [ "$(date +%s)" -lt "$deadline" ]; do
  snapshot
  now=$(capacity)
  if [ "$now" -gt "$PEAK" ]; then PEAK=$now; fi
  if [ "$PEAK" -gt "$BASE" ]; then break; fi
  sleep 10
done
[ "$PEAK" -gt "$BASE" ] || die "no scale-up within ${TIMEOUT_UP}s (capacity stayed at $BASE)"
echo "scaled up: capacity $BASE -> $PEAK"

echo "waiting up to ${TIMEOUT_DOWN}s for lag 0 and a scale-down"
deadline=$(( $(date +%s) + TIMEOUT_DOWN ))
down=0
while [ "$(date +%s)" -lt "$deadline" ]; do
  snapshot
  now=$(capacity)
  if [ "$now" -gt "$PEAK" ]; then PEAK=$now; fi
  lag=$(pc '{.status.lag}')
  if [ "${lag:-1}" = "0" ] && [ "$now" -lt "$PEAK" ]; then down=1; break; fi
  sleep 15
done
[ "$down" = "1" ] || die "no scale-down to below the peak ($PEAK) with lag 0 within ${TIMEOUT_DOWN}s"
echo "scaled back: capacity $PEAK -> $(capacity), lag 0"

log "7. summary"
kubectl get pc,statefulset,pods -n "$NS"
kubectl get events -n "$NS" --field-selector involvedObject.kind=ParallelConsumer --sort-by=.lastTimestamp | tail -n 20
echo "--- kubectl get pc -w ---"
cat "${TMPDIR:-/tmp}/multilane-e2e-watch.log"
log "e2e passed"
