#!/bin/bash
# envkit exec wrapper (runs inside the sandbox): exec.sh NONCE TIMEOUT_S COMMAND
# Runs COMMAND under bash with a timeout, then appends one status line to stderr:
#   NONCE <exit code> <new OOM kills> <new pids-limit hits> <start> <end> <children's CPU ticks before> <after>
# (start and end: bash's EPOCHREALTIME around the command, "-" where bash lacks it; the
# ticks: this shell's cutime + cstime from /proc, the command's own CPU once it is reaped).
# Everything is read with shell builtins only, so this works even when the pids limit
# leaves no room to fork.
nonce=$1
limit=$2
cmd=$3
counters() {
  OOM=0
  PIDSMAX=0
  local f a b
  for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
    [ -r "$f" ] || continue
    while read -r a b; do [ "$a" = oom_kill ] && OOM=$b; done < "$f"
  done
  for f in /sys/fs/cgroup/pids/pids.events /sys/fs/cgroup/pids.events; do
    [ -r "$f" ] || continue
    while read -r a b; do [ "$a" = max ] && PIDSMAX=$b; done < "$f"
  done
}
ticks() {
  TICKS=0
  local st
  read -r -a st < /proc/$$/stat 2>/dev/null && TICKS=$((st[15] + st[16]))
}
counters
oom0=$OOM
pids0=$PIDSMAX
ticks
ticks0=$TICKS
t0=${EPOCHREALTIME:--}
timeout -k 2 "$limit" /bin/bash -c "$cmd" < /dev/null
rc=$?
t1=${EPOCHREALTIME:--}
ticks
counters
printf '\n%s %d %d %d %s %s %d %d\n' "$nonce" "$rc" "$((OOM - oom0))" "$((PIDSMAX - pids0))" "$t0" "$t1" "$ticks0" "$TICKS" >&2
exit $rc
