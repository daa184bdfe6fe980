# Several booted Debian containers, each a node in its own network namespace with its own address on a
# bridge (the multi-node tests: multinode_test.sh, slurm_test.sh). Source container.sh, then this file,
# after setting work (the test's directory; each node's root is an overlay in work/NODE on work/base).
# Then:
#   nodes_init ID NODE...             names: the bridge, each node's namespace and host-side veth
#   nodes_net_up                      the bridge, a namespace per node with ADDR[NODE]/24 on host0
#   nodes_boot [nspawn options...]    unpack the rootfs once (unless work/base is there), an overlay and a
#                                     boot per node (HOST[NODE] its host name); the options (a bind of a
#                                     shared directory) apply to all
#   boot_node NODE                    boot NODE again (after ct_stop), with the same options
#   on NODE / ssh_node NODE 'CMD' / prop UNIT PROPERTY
#   tcp_rtt FROM ADDR PORT            median TCP connect time in ms from node FROM's namespace
#   nodes_deadline SECONDS WHO        a SIGTERM to this shell after SECONDS (the EXIT trap tears down)
#   nodes_finish RC WHAT              the end of the EXIT trap, after nodes_net_down: work removed (unless
#                                     something is still mounted below it), ct_finish's last line
#   demo_model STEPS                  the model, data and training entries of a job file: the demo MLP of
#                                     examples/fmnist-mlp.json, batch 64, STEPS steps (5,000 steps with two
#                                     asynchronous workers reach 0.87-0.88; 4,000 only 0.871-0.873)
#   nodes_teardown                    every container powered off at once, unmounted, removed; the
#                                     namespaces and the bridge deleted. Returns 1 if anything is left.
# The caller declares ADDR and HOST (associative, per node) before nodes_init; ST[NODE] keeps each
# container's state (ct_save).
# What works on these machines, and why: ../../../shared/notes/multinode-nspawn.md.

declare -A ST NS HV
NODES=()
NODE_OPTS=()
nodes_br=
nodes_id=
nodes_made_br=
nodes_deadline_pid=

nodes_init() {
        nodes_id=$1
        shift
        NODES=("$@")
        nodes_br=pfbr$nodes_id
        local n
        for n in "${NODES[@]}"; do
                NS[$n]=pfns$nodes_id$n      # the node's network namespace: it outlives the container's restarts
                HV[$n]=pfv$nodes_id$n       # the host's end of its veth pair, on the bridge
        done
}

nodes_net_up() {
        local n
        ip link add "$nodes_br" type bridge
        nodes_made_br=1
        ip link set "$nodes_br" up
        for n in "${NODES[@]}"; do
                ip netns add "${NS[$n]}"
                ip link add "${HV[$n]}" type veth peer name host0 netns "${NS[$n]}"
                sysctl -qw "net.ipv6.conf.${HV[$n]}.disable_ipv6=1"
                ip link set "${HV[$n]}" master "$nodes_br"
                ip link set "${HV[$n]}" up
                ip -n "${NS[$n]}" link set lo up
                ip -n "${NS[$n]}" addr add "${ADDR[$n]}/24" dev host0
                ip -n "${NS[$n]}" link set host0 up
        done
}

# A node's root: an overlay of its own upper directory on the one unpacked rootfs (a third of the
# unpacking; what a node installs stays in its upper directory across its restarts).
node_root() {
        local d=$work/$1
        mkdir -p "$d/upper" "$d/ovl" "$d/root"
        mount -t overlay "mn$nodes_id$1" -o "lowerdir=$work/base,upperdir=$d/upper,workdir=$d/ovl" "$d/root"
}
node_unmount() { ! mountpoint -q "$work/$1/root" || umount "$work/$1/root"; }
boot_node() {
        ct_start "mn$nodes_id$1" "$work/$1" "${CT_OPTS[@]}" "${NODE_OPTS[@]}" --network-namespace-path="/run/netns/${NS[$1]}" ||
                return 1
        ST[$1]=$(ct_save)
}

nodes_boot() {
        NODE_OPTS=("$@")
        if [ ! -d "$work/base" ]; then
                ct_psfleet_rootfs "$cache" "$pkgdir" "$data"
                mkdir -p "$work/base"
                tar -C "$work/base" --numeric-owner -xf "$CT_TARBALL"
        fi
        local n
        for n in "${NODES[@]}"; do
                node_root "$n"
                echo "${HOST[$n]}" >"$work/$n/root/etc/hostname"
                boot_node "$n" || fail "${HOST[$n]} did not boot"
        done
}

# on NODE: make NODE's container the current one (ct, ct_sh, prop run there).
on() { [ -n "${ST[$1]:-}" ] && ct_load "${ST[$1]}"; }
# ssh_node NODE 'COMMAND': as `ssh NODE 'COMMAND'` in docs/operations.md (stdin passes through).
ssh_node() { on "$1"; ct bash -c "$2"; }
prop() { ct systemctl show -P "$2" "$1"; }

# The nodes reach each other through the bridge (a port that need not be open: a refusal is an answer too).
tcp_rtt() {
        ip netns exec "${NS[$1]}" python3 - "$2" "$3" <<'PY'
import socket, statistics, sys, time
ts = []
for _ in range(15):
    s = socket.socket(); s.settimeout(3); t = time.monotonic()
    try:
        s.connect((sys.argv[1], int(sys.argv[2])))
    except ConnectionRefusedError:
        pass
    ts.append((time.monotonic() - t) * 1e3); s.close()
print("%.2f" % statistics.median(ts))
PY
}

# The test's own limit, below CTest's TIMEOUT (which kills without a teardown): a SIGTERM to this shell
# runs the EXIT trap once the command in progress (each one bounded) returns.
nodes_deadline() {
        local secs=$1 who=$2 top=$$
        (
                trap 'kill "$sp" 2>/dev/null; exit 0' TERM
                sleep "$secs" &
                sp=$!
                wait "$sp"
                echo "$who: over $secs s: stopping" >&2
                kill -TERM "$top"
        ) </dev/null &
        nodes_deadline_pid=$!
}

nodes_teardown() {
        local rc=0 n name i
        [ -z "$nodes_deadline_pid" ] || kill "$nodes_deadline_pid" 2>/dev/null || true
        # All power off at once: a psd whose chief is still up would wait out its stop grace.
        for n in "${NODES[@]}"; do
                on "$n" || continue
                [ -z "$CT_INIT_PID" ] || kill -s RTMIN+4 "$CT_INIT_PID" 2>/dev/null || true
        done
        for ((i = ${#NODES[@]} - 1; i >= 0; i--)); do
                n=${NODES[$i]}
                on "$n" || continue
                name=$CT_NAME
                ct_stop || rc=1
                node_unmount "$n" || { ct_log "cannot unmount $work/$n/root"; rc=1; }
                ct_teardown || rc=1
                # /run is no tmpfs here: nspawn will not remove this one itself.
                rmdir "/run/systemd/nspawn/propagate/$name" 2>/dev/null || true
        done
        return $rc
}

# After nodes_teardown and whatever the test added to the bridge: the namespaces and the bridge go.
nodes_net_down() {
        local rc=0 n
        for n in "${NODES[@]}"; do
                ip netns del "${NS[$n]}" 2>/dev/null || true
                ip link del "${HV[$n]}" 2>/dev/null || true
        done
        [ -z "$nodes_made_br" ] || ip link del "$nodes_br" 2>/dev/null || true
        for n in "${NODES[@]}"; do
                ! ip netns list | grep -q "^${NS[$n]}\b" || { ct_log "netns ${NS[$n]} left behind"; rc=1; }
        done
        ! ip link show "$nodes_br" >/dev/null 2>&1 || { ct_log "bridge $nodes_br left behind"; rc=1; }
        return $rc
}

nodes_finish() {
        local rc=$1
        if grep -q " $work/" /proc/self/mounts; then
                ct_log "mounts left below $work: not deleting it"
                rc=1
                work=
        fi
        CT_DIR=
        ct_finish "$rc" "$work" "$2"
}

demo_model() {
        cat <<EOF
  "model": {
    "input": [784], "seed": 1,
    "layers": [{"type": "dense", "units": 256}, {"type": "relu"},
               {"type": "dense", "units": 128}, {"type": "relu"},
               {"type": "dense", "units": 64}, {"type": "relu"},
               {"type": "dense", "units": 10}]
  },
  "data": {"dir": "$data"},
  "training": {"batch_size": 64, "optimizer": "momentum", "momentum": 0.9, "nesterov": true,
               "learning_rate": 0.02, "lr_schedule": "exponential", "lr_decay_rate": 0.5,
               "lr_decay_steps": 1000, "max_steps": $1, "report_every_steps": 50,
               "threads": 1, "seed": 1}
EOF
}
