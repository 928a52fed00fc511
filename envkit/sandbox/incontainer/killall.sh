#!/bin/sh
# envkit (container environments): killall.sh [-k PID] [PATH...]
# Kills every process in the sandbox but PID 1 (the init), PID (the command channel, when the
# sandbox has one) or else the init's first child (the container's `sleep infinity`: children
# are listed in the order they came, so orphans the init adopted come after it), and itself,
# in rounds until one finds nothing (a process forking while a round runs is caught by the
# next; at most 1000 rounds); then removes each PATH (the verifier's folders, so nothing the
# agent left there is taken for the verifier's). The kill uses shell builtins only (kill,
# read, case), so it works in any image with /bin/sh and when the pids limit leaves little
# room to fork. Prints {"killed": true|false, "removed": true|false}.
keep=
if [ "${1:-}" = -k ]; then
  keep=$2
  shift 2
fi
tries=0
while [ -z "$keep" ] && [ $tries -lt 1000 ]; do  # the init may not have forked it yet
  tries=$((tries + 1))
  read -r keep _ < /proc/1/task/1/children 2>/dev/null
done
[ -n "$keep" ] || keep=1
self=$$
round=0
found=1
while [ $found = 1 ] && [ $round -lt 1000 ]; do
  round=$((round + 1))
  found=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$p" in 1|"$keep"|"$self") continue ;; esac
    { read -r st < "$d/stat"; } 2>/dev/null || continue
    st=${st##*) }
    case "${st%% *}" in Z|X) continue ;; esac  # already dead, waiting for its parent to reap it
    if kill -9 "$p" 2>/dev/null; then found=1; fi
  done
done
killed=true
[ $found = 0 ] || killed=false
removed=true
if [ $# -gt 0 ]; then
  rm -rf -- "$@" 2>/dev/null
  for p in "$@"; do
    if [ -e "$p" ] || [ -L "$p" ]; then removed=false; fi
  done
fi
echo "{\"killed\": $killed, \"removed\": $removed}"
