#!/bin/bash
# In the VM: two meshd on two rails (rail0, rail1 carry both nodes' addresses); take rail1 down and
# see where node 1's threads sleep.
B=/work/main/build
W=$(mktemp -d)
cat > $W/m.conf <<EOC
cluster = { name = "st"; transport = "rdma"; qps_per_link = 2; keepalive_interval_ms = 300; keepalive_timeout_ms = 2000;
  connect_timeout_ms = 1000; handshake_timeout_ms = 5000; backoff_initial_ms = 100; backoff_max_ms = 400; log_level = "debug"; };
nodes = ( { id = 1; addr = "10.78.0.1"; port = 7481; rails = [ "10.79.0.1" ]; },
          { id = 2; addr = "10.78.0.2"; port = 7482; rails = [ "10.79.0.2" ]; } );
EOC
export MESH_LOG_TIME=1
$B/node/meshd -c $W/m.conf -n 1 -s $W/s1 > $W/l1 2>&1 &
P1=$!
$B/node/meshd -c $W/m.conf -n 2 -s $W/s2 > $W/l2 2>&1 &
P2=$!
for i in $(seq 50); do $B/node/meshctl -s $W/s1 links 2>/dev/null | grep -q " UP " && break; sleep 0.2; done
$B/node/meshctl -s $W/s1 links
echo "== rail1 down at $(cat /proc/uptime)"
ip link set rail1 down
for k in 1 2 3; do
  sleep 1
  echo "== +$k s: node 1 threads"
  for t in /proc/$P1/task/*; do echo "$(cat $t/comm) $(cat $t/wchan) $(cat $t/stat | cut -d' ' -f3)"; cat $t/stack 2>/dev/null | head -12; done
done
sleep ${HOLD:-3}
ip link set rail1 up
echo "== rail1 up at $(cat /proc/uptime)"
sleep ${AFTER:-8}
$B/node/meshctl -s $W/s1 links
kill $P1 $P2; wait
for a in 10.79.0 10.78.0; do
  rping -s -a $a.1 -v -C 2 > /tmp/rps 2>&1 &
  sleep 0.5
  echo "== rping $a.2 -> $a.1 (fresh ids, after meshd exited): $(timeout 10 rping -c -a $a.1 -I $a.2 -v -C 2 2>&1 | tail -2 | tr '\n' ' ') rc=$?"
  kill %1 2>/dev/null; wait 2>/dev/null
done
# A fresh meshd pair on the same devices
$B/node/meshd -c $W/m.conf -n 1 -s $W/s1 > $W/l1b 2>&1 &
P1=$!
$B/node/meshd -c $W/m.conf -n 2 -s $W/s2 > $W/l2b 2>&1 &
P2=$!
sleep 8
echo "== fresh meshd pair:"; $B/node/meshctl -s $W/s1 links
kill $P1 $P2; wait
echo "== node 1 log"; grep -v "rdma_qp_established" $W/l1 | tail -40 | cut -c1-220
echo "== node 2 log"; grep -v "rdma_qp_established" $W/l2 | tail -30 | cut -c1-220
