#!/bin/sh
# docker-compose.yml's Kafka (the apache/kafka image): one KRaft node with the local broker's security,
# as infra/kafka/server.properties.template has it: SASL/SCRAM-SHA-512 for clients and the inter-broker
# link, SASL/PLAIN for the controller link, StandardAuthorizer with admin the only super user. The log dir
# is formatted once with a SCRAM user for each "name:password" of KAFKA_SCRAM_USERS; the ACLs are applied
# by `lorafleet services init`. Clients reach it at KAFKA_ADVERTISED_HOST:KAFKA_PORT (kafka:9092 on the
# compose network; the test suite's container advertises 127.0.0.1 on a port it publishes as itself).
set -eu
: "${KAFKA_ADMIN_PASSWORD:?}" "${KAFKA_SCRAM_USERS:?}"
port="${KAFKA_PORT:-9092}"
host="${KAFKA_ADVERTISED_HOST:-kafka}"
conf=/tmp/server.properties
data=/tmp/kraft-combined-logs
jaas="required username=\"admin\" password=\"$KAFKA_ADMIN_PASSWORD\""
cat > "$conf" <<PROPERTIES
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@kafka:9093
listeners=SASL_PLAINTEXT://:$port,CONTROLLER://:9093
advertised.listeners=SASL_PLAINTEXT://$host:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_PLAINTEXT
listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule $jaas;
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule $jaas user_admin="$KAFKA_ADMIN_PASSWORD";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin
allow.everyone.if.no.acl.found=false
log.dirs=$data
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
PROPERTIES
# the admin's client login, for the healthcheck
cat > /tmp/admin.properties <<PROPERTIES
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule $jaas;
PROPERTIES
if [ ! -f "$data/meta.properties" ]; then
  set --
  for user in $KAFKA_SCRAM_USERS; do
    set -- "$@" --add-scram "SCRAM-SHA-512=[name=${user%%:*},password=${user#*:}]"
  done
  /opt/kafka/bin/kafka-storage.sh format -t "$(/opt/kafka/bin/kafka-storage.sh random-uuid)" -c "$conf" "$@"
fi
exec /opt/kafka/bin/kafka-server-start.sh "$conf"
