#!/usr/bin/env bash
# End-to-end check of the multilane operator on a local kind cluster.
#
# NOT RUN: neither by CI, nor by scripts/test.sh, nor by anyone on the development machines of this
# repository, which have no Docker engine. It needs Docker, kind >= 0.24, kubectl and a helm v3/v4
# binary. tests/chart/test_dockerfile.py only checks that it parses (bash -n) and passes shellcheck.
# Treat it as a written procedure that has never been executed: expect to fix it on its first run.
#
# What it does:
#   1. creates a kind cluster (kind >= 0.24 enforces NetworkPolicy, so the chart's policies are live);
#   2. builds the multilane image from ./Dockerfile and loads it into the cluster;
#   3. installs a single-node Kafka (apache/kafka, KRaft mode: one pod is broker and controller; no
#      operator, no persistence: a throwaway broker for the test);
#   4. installs the chart (charts/multilane) with the freshly built image;
#   5. runs each scenario of $SCENARIOS, each with its own topic, ParallelConsumer (named like the
#      scenario) and state volumes, the stateful processor multilane.demo.processors:stateful_io
#      (a per-key counter in the state store + $SLEEP_MS ms of I/O per record) and state enabled
#      (restore-before-handoff), under load from `multilane loadgen --output` in a pod;
#   6. after each scenario, applies the delivery checkers to the processors' logs: each pod's
#      processor writes its event log on its state volume (MULTILANE_TEST_LOG, so it outlives pod
#      restarts and scale-downs); a collector pod mounts every state volume of the scenario and runs
#      `multilane check-logs` (at-least-once, per-key order, exclusive key, replays) against the
#      produced set, with a kill marker for every kill this script made;
#   7. deletes the cluster (KEEP=1 keeps it for inspection). Logs and reports: $OUT/<scenario>/.
#
# Scenario names are those of the emulated-cluster tests (tests/operator/test_k8s_*.py, real worker
# processes against the emulated API server; docs/operator.md "End to end through the operator"):
#   burst           RECORDS records as fast as possible; capacity (replicas x factor) goes up, the lag
#                   is cleared, capacity comes back down (autoscaling, not pinned).
#   scale-up-down   `kubectl scale pcon --replicas=2` under load, then back to 1.
#   kill-learning   scale 1 -> 2 under load; SIGKILL the new pod's process while it learns;
#   kill-releasing  ... the old owner's process while it releases;
#   kill-promoting  ... the new owner's process while it promotes.
#                   kill -9 is sent from the kind node (`crictl inspect` gives the container's host
#                   PID): `kubectl exec ... kill -9 1` cannot work, PID 1 of a container ignores
#                   SIGKILL from inside its own PID namespace. The kubelet restarts the container in
#                   the same pod, as the emulated tests' StatefulSet double does. The kill lands when
#                   this script sees the move in that phase (kubectl polling): a short phase can be
#                   missed, and the scenario then fails saying so.
#   operator-restart  scale 1 -> 2 under load; force-delete the operator pod while status.rollout is
#                   set; the new operator pod resumes the rollout from status.
#   immutable-change  under load, change spec.state.storage.size (an immutable StatefulSet field): the
#                   StatefulSet is held with Degraded=ImmutableFieldChange; then the annotation
#                   multilane.dev/recreate-on-immutable-change=true recreates it (orphan delete): the
#                   pod keeps running (same uid), the condition clears, nothing is lost (checkers).
#                   Emulated: tests/operator/test_day2.py.
#   image-change    2 pods under load; spec.workload.image changes to a second tag of the same image:
#                   the operator replaces the pods one at a time (StatefulSet updateStrategy OnDelete),
#                   each pod's partitions handed to a warm owner first; every pod ends on the new
#                   template hash with a new UID, and the checkers pass.
# Not here: lease-lost (needs a network partition between one pod and the API server) and
# chart-operator (every scenario here runs the chart's operator).
#
# Usage: scripts/e2e-kind.sh                     (all scenarios)
#        SCENARIOS="burst kill-releasing" scripts/e2e-kind.sh
# Settings below can be overridden from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${CLUSTER:-multilane-e2e}
IMAGE=${IMAGE:-multilane:e2e}
KAFKA_IMAGE=${KAFKA_IMAGE:-apache/kafka:3.9.0}
NS=${NS:-e2e}
OPERATOR_NS=${OPERATOR_NS:-multilane-system}
PARTITIONS=${PARTITIONS:-4}
RECORDS=${RECORDS:-100000}        # burst: records produced as fast as possible
RATE=${RATE:-200}                 # other scenarios: records per second ...
LOAD_S=${LOAD_S:-60}              # ... for this many seconds
SLEEP_MS=${SLEEP_MS:-5}
TIMEOUT_UP=${TIMEOUT_UP:-600}     # seconds to observe the burst's scale-up
TIMEOUT_DOWN=${TIMEOUT_DOWN:-1200} # seconds to observe the burst's lag 0 and scale-down
TIMEOUT_STEP=${TIMEOUT_STEP:-300} # seconds for a scale step, a kill or a drain in the other scenarios
SCENARIOS=${SCENARIOS:-burst scale-up-down kill-learning kill-releasing kill-promoting operator-restart immutable-change image-change}
OUT=${OUT:-e2e-out}
KEEP=${KEEP:-0}
BOOTSTRAP="kafka.kafka.svc.cluster.local:9092"
STATE_DIR=/var/lib/multilane/state  # the worker's state volume (multilane/operator/spec/children.py)
NODE="$CLUSTER-control-plane"

log() { printf '\n==> %s\n' "$*"; }
die() { printf 'e2e-kind: %s\n' "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "needs '$1' on PATH"; }

for tool in docker kind kubectl helm; do need "$tool"; done
docker info >/dev/null 2>&1 || die "no Docker engine reachable (docker info failed)"
mkdir -p "$OUT"

WATCH_PID=""
CURRENT=""
cleanup() {
  local code=$?
  if [ -n "$WATCH_PID" ]; then kill "$WATCH_PID" 2>/dev/null || true; fi
  if [ "$code" -ne 0 ]; then
    log "failed (exit $code) in scenario ${CURRENT:-setup}: diagnostics"
    kubectl get pcon,sts,pods,pvc -n "$NS" -o wide 2>/dev/null || true
    if [ -n "$CURRENT" ]; then kubectl describe pcon "$CURRENT" -n "$NS" 2>/dev/null | tail -n 40 || true; fi
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

# ---- helpers (NAME = the scenario's ParallelConsumer) --------------------------------------------

# jsonpath of ParallelConsumer $1, empty when unset
pc() { kubectl get pcon "$1" -n "$NS" -o "jsonpath=$2" 2>/dev/null || true; }
capacity() {
  local r f
  r=$(pc "$1" '{.status.replicas}'); f=$(pc "$1" '{.status.factor}')
  echo $(( ${r:-0} * ${f:-0} ))
}
snapshot() {
  printf '%s  ' "$(date -u +%H:%M:%S)"
  kubectl get pcon "$1" -n "$NS" --no-headers \
    -o custom-columns=READY:'.status.conditions[?(@.type=="Ready")].status',REPLICAS:.status.replicas,FACTOR:.status.factor,LAG:.status.lag,REASON:.status.lastDecision.reason \
    2>/dev/null || echo "(not yet)"
}
# workers that own at least one partition, when no rollout and no assignment change is pending
owners_settled() {
  local rollout pending
  rollout=$(pc "$1" '{.status.rollout}'); pending=$(pc "$1" '{.status.assignment.pending}')
  if [ -n "$rollout" ] || [ -n "$pending" ]; then echo 0; return; fi
  pc "$1" '{range .status.assignment.members[*]}{.worker}={.partitions}{"\n"}{end}' \
    | grep -c '=\[..*\]' || true
}
# wait until $1 has exactly $2 owning workers and every one of its pods is Ready
wait_owners() {
  local name=$1 want=$2 deadline
  deadline=$(( $(date +%s) + TIMEOUT_STEP ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if [ "$(owners_settled "$name")" = "$want" ] && \
       kubectl wait -n "$NS" --for=condition=Ready pod -l "multilane.dev/consumer=$name" --timeout=5s >/dev/null 2>&1; then
      return 0
    fi
    snapshot "$name"; sleep 3
  done
  die "$name: not settled on $want workers within ${TIMEOUT_STEP}s"
}
# wait until object $1 (e.g. pod/NAME) no longer exists
wait_gone() {
  local deadline
  deadline=$(( $(date +%s) + TIMEOUT_STEP ))
  while [ -n "$(kubectl get "$1" -n "$NS" --ignore-not-found -o name)" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$1 still exists after ${TIMEOUT_STEP}s"
    sleep 2
  done
}
create_topic() {
  kubectl exec -n kafka kafka-0 -- /opt/kafka/bin/kafka-topics.sh --bootstrap-server localhost:9092 \
    --create --if-not-exists --topic "$1" --partitions "$PARTITIONS" --replication-factor 1
}
# apply ParallelConsumer $1 on topic $1; $2: "pinned" (spec.scaling.replicas: 1) or "auto"
apply_consumer() {
  local name=$1 pinned=""
  if [ "$2" = "pinned" ]; then pinned="replicas: 1"; fi
  kubectl apply -n "$NS" -f - <<EOF
apiVersion: multilane.dev/v1alpha1
kind: ParallelConsumer
metadata:
  name: $name
spec:
  kafka:
    bootstrapServers: $BOOTSTRAP
    topics: [$name]
    consumerGroup: $name-e2e
  workload:
    image: $IMAGE
    imagePullPolicy: Never
    processor: multilane.demo.processors:stateful_io
    env:
      - {name: MULTILANE_DEMO_SLEEP_MS, value: "$SLEEP_MS"}
      - {name: MULTILANE_TEST_LOG, value: "$STATE_DIR/events.log"}
    resources:
      requests: {cpu: 100m, memory: 256Mi}
      limits: {memory: 768Mi}
  state:
    enabled: true
    acceptableRecoveryLag: 500
    learnerTimeoutSeconds: 120
  scaling:
    minReplicas: 1
    maxReplicas: $PARTITIONS
    minFactor: 2
    maxFactor: 16
    targetCatchUpSeconds: 60
    scaleDownDelaySeconds: 60
    stabilisationSeconds: 20
    intervalSeconds: 5
    $pinned
EOF
  kubectl wait -n "$NS" --for=condition=Ready "pcon/$name" --timeout=300s
  wait_owners "$name" 1
}
# start the load generator pod load-$1 (records to topic $1): "$2" are loadgen's rate arguments.
# It prints the produced set after a marker line, for produced_set.
start_load() {
  local name=$1; shift
  kubectl run "load-$name" -n "$NS" --image="$IMAGE" --image-pull-policy=Never --restart=Never \
    --command -- sh -c "multilane loadgen --bootstrap-servers $BOOTSTRAP --topic $name $* --keys 10000 \
      --output /tmp/produced.tsv >&2 && echo '--- produced ---' && cat /tmp/produced.tsv"
}
wait_load() {
  kubectl wait -n "$NS" --for=jsonpath='{.status.phase}'=Succeeded "pod/load-$1" --timeout="${TIMEOUT_STEP}s"
}
# wait until the load is done and the consumer's lag is 0
wait_drained() {
  local name=$1 deadline
  wait_load "$name"
  deadline=$(( $(date +%s) + TIMEOUT_STEP ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if [ "$(pc "$name" '{.status.lag}')" = "0" ]; then return 0; fi
    snapshot "$name"; sleep 5
  done
  die "$name: lag not 0 within ${TIMEOUT_STEP}s of the end of the load"
}
# kill -9 the worker process of pod $1 from the kind node; prints the kill's epoch
kill9_pod() {
  local pod=$1 cid hostpid at
  cid=$(kubectl get pod "$pod" -n "$NS" -o jsonpath='{.status.containerStatuses[0].containerID}')
  cid=${cid#*://}
  hostpid=$(docker exec "$NODE" crictl inspect --output go-template --template '{{.info.pid}}' "$cid")
  at=$(date +%s.%N)
  docker exec "$NODE" kill -9 "$hostpid"
  echo "$at"
}
# the first move of $1's rollout in phase $2, as "target source" (empty when none)
move_in_phase() {
  pc "$1" '{range .status.rollout.moves[*]}{.phase} {.target} {.source}{"\n"}{end}' \
    | awk -v phase="$2" '$1 == phase && $3 != "" { print $2, $3; exit }'
}
# apply the delivery checkers to every event log of scenario $1 (pods $1-0 .. $1-N of its PVCs);
# "$2": extra `multilane check-logs` arguments (kill markers)
check_logs() {
  local name=$1 extra=${2:-} dir="$OUT/$1" claims volumes="" mounts="" events="" i=0 claim
  mkdir -p "$dir"
  kubectl logs -n "$NS" "load-$name" | sed -n '/^--- produced ---$/,$p' | tail -n +2 >"$dir/produced.tsv"
  [ -s "$dir/produced.tsv" ] || die "$name: no produced set in the load generator's output"
  claims=$(kubectl get pvc -n "$NS" -o name | sed -n "s#^persistentvolumeclaim/\\(state-$name-[0-9]*\\)\$#\\1#p" | sort)
  [ -n "$claims" ] || die "$name: no state volumes found"
  for claim in $claims; do
    volumes="$volumes    - {name: v$i, persistentVolumeClaim: {claimName: $claim, readOnly: true}}
"
    mounts="$mounts        - {name: v$i, mountPath: /logs/$claim, readOnly: true}
"
    events="$events --events /logs/$claim/events.log"
    i=$((i + 1))
  done
  kubectl apply -n "$NS" -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: collect-$name
spec:
  restartPolicy: Never
  containers:
    - name: collect
      image: $IMAGE
      imagePullPolicy: Never
      command: [sleep, "3600"]
      volumeMounts:
$mounts  volumes:
$volumes
EOF
  kubectl wait -n "$NS" --for=condition=Ready "pod/collect-$name" --timeout=180s
  kubectl exec -i -n "$NS" "collect-$name" -- sh -c 'cat > /tmp/produced.tsv' <"$dir/produced.tsv"
  for claim in $claims; do
    kubectl exec -n "$NS" "collect-$name" -- cat "/logs/$claim/events.log" >"$dir/$claim.events.log" || true
  done
  # shellcheck disable=SC2086  # $events and $extra are lists of arguments
  if ! kubectl exec -n "$NS" "collect-$name" -- multilane check-logs --produced /tmp/produced.tsv \
       --topic "$name" $events $extra | tee "$dir/check-logs.txt"; then
    die "$name: delivery checks failed (see $dir/check-logs.txt)"
  fi
  kubectl delete pod -n "$NS" "collect-$name" --wait=false >/dev/null
}
finish_scenario() {
  kubectl delete pcon "$1" -n "$NS" --wait=true >/dev/null
  kubectl delete pod -n "$NS" "load-$1" --wait=false >/dev/null 2>&1 || true
  log "scenario $1 passed"
}

# ---- the scenarios ---------------------------------------------------------------------------------

scenario_immutable_change() {
  local name=immutable-change old_uid pod_uid reason="" deadline
  apply_consumer "$name" pinned
  start_load "$name" --rate "$RATE" --duration "$LOAD_S"
  sleep 10
  old_uid=$(kubectl get statefulset "$name" -n "$NS" -o jsonpath='{.metadata.uid}')
  pod_uid=$(kubectl get pod "$name-0" -n "$NS" -o jsonpath='{.metadata.uid}')
  kubectl patch pcon "$name" -n "$NS" --type=merge -p '{"spec":{"state":{"storage":{"size":"11Gi"}}}}'
  deadline=$(( $(date +%s) + TIMEOUT_STEP ))
  while [ "$reason" != "ImmutableFieldChange" ] && [ "$(date +%s)" -lt "$deadline" ]; do
    reason=$(pc "$name" '{.status.conditions[?(@.type=="Degraded")].reason}'); sleep 2
  done
  [ "$reason" = "ImmutableFieldChange" ] || die "$name: no Degraded=ImmutableFieldChange within ${TIMEOUT_STEP}s"
  pc "$name" '{.status.conditions[?(@.type=="Degraded")].message}'; echo
  [ "$(kubectl get statefulset "$name" -n "$NS" -o jsonpath='{.metadata.uid}')" = "$old_uid" ] \
    || die "$name: the StatefulSet changed without the opt-in"
  kubectl annotate pcon "$name" -n "$NS" multilane.dev/recreate-on-immutable-change=true
  deadline=$(( $(date +%s) + TIMEOUT_STEP ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    if [ "$(kubectl get statefulset "$name" -n "$NS" -o jsonpath='{.metadata.uid}' 2>/dev/null)" != "$old_uid" ] \
       && [ "$(pc "$name" '{.status.conditions[?(@.type=="Degraded")].reason}')" != "ImmutableFieldChange" ]; then
      break
    fi
    sleep 2
  done
  [ "$(pc "$name" '{.status.conditions[?(@.type=="Degraded")].reason}')" != "ImmutableFieldChange" ] \
    || die "$name: StatefulSet not recreated within ${TIMEOUT_STEP}s"
  [ "$(kubectl get pod "$name-0" -n "$NS" -o jsonpath='{.metadata.uid}')" = "$pod_uid" ] \
    || echo "note: pod $name-0 was replaced (the update strategy rolls it to the new template)"
  wait_drained "$name"
  check_logs "$name"
}

scenario_burst() {
  local name=burst base peak now lag deadline down=0
  apply_consumer "$name" auto
  kubectl get pcon -n "$NS" "$name"
  base=$(capacity "$name")
  [ "$base" -ge 1 ] || die "no capacity reported before the burst (replicas x factor = $base)"
  echo "capacity before the burst: $base (replicas x factor)"
  kubectl get pcon "$name" -n "$NS" -w >"$OUT/$name-watch.log" 2>&1 &
  WATCH_PID=$!
  start_load "$name" --records "$RECORDS"
  echo "waiting up to ${TIMEOUT_UP}s for a scale-up"
  peak=$base
  deadline=$(( $(date +%s) + TIMEOUT_UP ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    snapshot "$name"
    now=$(capacity "$name")
    if [ "$now" -gt "$peak" ]; then peak=$now; fi
    if [ "$peak" -gt "$base" ]; then break; fi
    sleep 10
  done
  [ "$peak" -gt "$base" ] || die "no scale-up within ${TIMEOUT_UP}s (capacity stayed at $base)"
  echo "scaled up: capacity $base -> $peak"
  wait_load "$name"
  echo "waiting up to ${TIMEOUT_DOWN}s for lag 0 and a scale-down"
  deadline=$(( $(date +%s) + TIMEOUT_DOWN ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    snapshot "$name"
    now=$(capacity "$name")
    if [ "$now" -gt "$peak" ]; then peak=$now; fi
    lag=$(pc "$name" '{.status.lag}')
    if [ "${lag:-1}" = "0" ] && [ "$now" -lt "$peak" ]; then down=1; break; fi
    sleep 15
  done
  [ "$down" = "1" ] || die "no scale-down to below the peak ($peak) with lag 0 within ${TIMEOUT_DOWN}s"
  echo "scaled back: capacity $peak -> $(capacity "$name"), lag 0"
  kill "$WATCH_PID" 2>/dev/null || true
  WATCH_PID=""
  check_logs "$name"
  kubectl get events -n "$NS" --field-selector "involvedObject.name=$name" --sort-by=.lastTimestamp | tail -n 20
}

scenario_scale_up_down() {
  local name=scale-up-down
  apply_consumer "$name" pinned
  start_load "$name" --rate "$RATE" --duration "$LOAD_S"
  sleep 10
  kubectl scale pcon "$name" -n "$NS" --replicas=2
  wait_owners "$name" 2
  kubectl scale pcon "$name" -n "$NS" --replicas=1
  wait_owners "$name" 1
  wait_gone "pod/$name-1"
  wait_drained "$name"
  check_logs "$name"
}

# the pods of $1 whose multilane.dev/template-hash is not the StatefulSet's (0 when rolled)
outdated_pods() {
  local want
  want=$(kubectl get statefulset "$1" -n "$NS" \
    -o "jsonpath={.spec.template.metadata.annotations['multilane\\.dev/template-hash']}")
  kubectl get pods -n "$NS" -l "multilane.dev/consumer=$1" \
    -o "jsonpath={range .items[*]}{.metadata.annotations['multilane\\.dev/template-hash']}{'\\n'}{end}" \
    | grep -cv "^$want\$" || true
}

scenario_image_change() {
  local name=image-change before after deadline
  apply_consumer "$name" pinned
  kubectl scale pcon "$name" -n "$NS" --replicas=2
  wait_owners "$name" 2
  docker tag "$IMAGE" "${IMAGE%%:*}:e2e-v2"
  kind load docker-image "${IMAGE%%:*}:e2e-v2" --name "$CLUSTER"
  before=$(kubectl get pods -n "$NS" -l "multilane.dev/consumer=$name" -o jsonpath='{.items[*].metadata.uid}')
  start_load "$name" --rate "$RATE" --duration "$LOAD_S"
  sleep 10
  kubectl patch pcon "$name" -n "$NS" --type merge \
    -p "{\"spec\":{\"workload\":{\"image\":\"${IMAGE%%:*}:e2e-v2\"}}}"
  deadline=$(( $(date +%s) + TIMEOUT_STEP ))
  until [ "$(outdated_pods "$name")" = 0 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die "$name: pods not replaced within ${TIMEOUT_STEP}s"
    snapshot "$name"; sleep 3
  done
  wait_owners "$name" 2
  after=$(kubectl get pods -n "$NS" -l "multilane.dev/consumer=$name" -o jsonpath='{.items[*].metadata.uid}')
  for uid in $before; do
    case " $after " in *" $uid "*) die "$name: pod $uid was not replaced" ;; esac
  done
  kubectl get events -n "$NS" --field-selector reason=WorkerReplaced -o name | grep -q . \
    || die "$name: no WorkerReplaced Event"
  wait_drained "$name"
  check_logs "$name"
}

# kill-learning | kill-releasing | kill-promoting
scenario_kill() {
  local name=$1 phase=${1#kill-} move="" victim at deadline ordinal restarts
  apply_consumer "$name" pinned
  start_load "$name" --rate "$RATE" --duration "$LOAD_S"
  sleep 10
  kubectl scale pcon "$name" -n "$NS" --replicas=2
  deadline=$(( $(date +%s) + TIMEOUT_STEP ))
  while [ -z "$move" ] && [ "$(date +%s)" -lt "$deadline" ]; do
    move=$(move_in_phase "$name" "$phase")
  done
  [ -n "$move" ] || die "$name: no move seen in phase $phase within ${TIMEOUT_STEP}s (a short phase can be missed)"
  # the target learns and promotes; the source releases
  if [ "$phase" = "releasing" ]; then victim=${move#* }; else victim=${move% *}; fi
  at=$(kill9_pod "$victim")
  echo "$name: kill -9 of $victim's process at $at (move $move in $phase)"
  deadline=$(( $(date +%s) + TIMEOUT_STEP ))
  restarts=0
  while [ "${restarts:-0}" -lt 1 ] && [ "$(date +%s)" -lt "$deadline" ]; do
    sleep 2
    restarts=$(kubectl get pod "$victim" -n "$NS" -o jsonpath='{.status.containerStatuses[0].restartCount}')
  done
  [ "${restarts:-0}" -ge 1 ] || die "$name: $victim's container was not restarted"
  wait_owners "$name" 2
  wait_drained "$name"
  ordinal=${victim##*-}
  check_logs "$name" "--kill /logs/state-$name-$ordinal/events.log@$at"
}

scenario_operator_restart() {
  local name=operator-restart generation after deadline rollout=""
  apply_consumer "$name" pinned
  start_load "$name" --rate "$RATE" --duration "$LOAD_S"
  sleep 10
  generation=$(pc "$name" '{.status.assignment.generation}')
  kubectl scale pcon "$name" -n "$NS" --replicas=2
  deadline=$(( $(date +%s) + TIMEOUT_STEP ))
  while [ -z "$rollout" ] && [ "$(date +%s)" -lt "$deadline" ]; do
    rollout=$(pc "$name" '{.status.rollout}')
  done
  [ -n "$rollout" ] || die "$name: no rollout in status within ${TIMEOUT_STEP}s"
  kubectl delete pod -n "$OPERATOR_NS" --grace-period=0 --force \
    -l app.kubernetes.io/instance=multilane,app.kubernetes.io/component=operator
  kubectl rollout status -n "$OPERATOR_NS" deployment/multilane --timeout=180s
  wait_owners "$name" 2
  after=$(pc "$name" '{.status.assignment.generation}')
  [ "${after:-0}" -gt "${generation:-0}" ] || die "$name: assignment generation did not move ($generation -> $after)"
  wait_drained "$name"
  check_logs "$name"
}

# ---- setup ----------------------------------------------------------------------------------------

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

log "3. single-node Kafka ($KAFKA_IMAGE, KRaft)"
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

log "4. helm install the chart (image $IMAGE)"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f -
helm upgrade --install multilane charts/multilane \
  --namespace "$OPERATOR_NS" --create-namespace \
  --set fullnameOverride=multilane \
  --set image.repository="${IMAGE%%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --set "networkPolicy.namespaces={$NS}" \
  --set "rbac.secretNamespaces={$NS}" \
  --wait --timeout 5m
kubectl get crd parallelconsumers.multilane.dev >/dev/null
kubectl rollout status -n "$OPERATOR_NS" deployment/multilane --timeout=180s

# ---- 5.-6. scenarios -------------------------------------------------------------------------------

for scenario in $SCENARIOS; do
  CURRENT=$scenario
  log "5. scenario $scenario"
  create_topic "$scenario"
  case "$scenario" in
    burst) scenario_burst ;;
    scale-up-down) scenario_scale_up_down ;;
    kill-learning|kill-releasing|kill-promoting) scenario_kill "$scenario" ;;
    operator-restart) scenario_operator_restart ;;
    immutable-change) scenario_immutable_change ;;
    image-change) scenario_image_change ;;
    *) die "unknown scenario $scenario" ;;
  esac
  finish_scenario "$scenario"
done
CURRENT=""

log "7. summary"
kubectl get pcon,statefulset,pods,pvc -n "$NS"
for scenario in $SCENARIOS; do
  printf '%-18s %s\n' "$scenario" "$(tail -n 1 "$OUT/$scenario/check-logs.txt")"
done
log "e2e passed (logs and checker reports in $OUT/)"
