#!/usr/bin/env bash
# Resolves Apache Kafka's broker jars (deps/kafka/pom.xml, a pinned release) from Maven Central into
#   ${XDG_CACHE_HOME:-~/.cache}/multilane/kafka/<kafka.version>/
# and prints that directory as its last line. multilane.testing.apache.ApacheKafka runs the broker
# from it (override with MULTILANE_KAFKA_JARS=DIR).
#
# Idempotent: a directory whose stamp (.complete) matches the pom's checksum is reused as it is, so a
# second run takes well under a second. A first run downloads ~45 MB with Maven into ~/.m2 and copies
# the runtime jars; concurrent runs wait for each other (flock). Needs java (17+) and mvn.
set -euo pipefail
cd "$(dirname "$0")/.."
POM=deps/kafka/pom.xml

die() { echo "kafka-jars: $*" >&2; exit 1; }
[ -f "$POM" ] || die "$POM is missing"
VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM" | head -n 1)
[ -n "$VERSION" ] || die "no <kafka.version> in $POM"
SUM=$(sha256sum "$POM" | cut -d' ' -f1)
ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/multilane/kafka
DIR=$ROOT/$VERSION

current() { [ -f "$DIR/.complete" ] && [ "$(cat "$DIR/.complete")" = "$SUM" ]; }
if current; then echo "$DIR"; exit 0; fi

command -v java >/dev/null 2>&1 || die "java is not on PATH (Apache Kafka $VERSION needs Java 17+; bash scripts/bootstrap.sh installs it)"
command -v mvn >/dev/null 2>&1 || die "mvn is not on PATH (bash scripts/bootstrap.sh installs Maven)"

mkdir -p "$ROOT"
exec 9>"$ROOT/.lock-$VERSION"
flock 9
if current; then echo "$DIR"; exit 0; fi  # another run finished it while this one waited

# Resolve into a fresh directory beside the target, then swap it in: a half-copied directory is
# never taken for a complete one.
TMP=$(mktemp -d "$ROOT/.tmp-$VERSION-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
echo "kafka-jars: resolving Apache Kafka $VERSION (deps/kafka/pom.xml) into $DIR" >&2
mvn -q -B -Dstyle.color=never -f "$POM" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$TMP" >&2 \
  || die "mvn could not resolve $POM (is Maven Central reachable?)"
ls "$TMP"/kafka_2.13-"$VERSION".jar >/dev/null 2>&1 || die "kafka_2.13-$VERSION.jar missing after resolve"
echo "$SUM" > "$TMP/.complete"
rm -rf "$DIR"
mv "$TMP" "$DIR"
trap - EXIT
echo "$DIR"
