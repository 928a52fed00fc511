#!/bin/sh
# envkit (container environments): killall.sh KEEP_PID
# Kills every process in the sandbox but PID 1 (the init), KEEP_PID (the container's
# `sleep infinity`) and itself. Shell builtins only (kill, read, case), so it works in any
# image with /bin/sh and when the pids limit leaves little room to fork.
keep=$1
self=$$
round=0
while [ $round -lt 5 ]; do
  round=$((round + 1))
  found=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$p" in 1|"$keep"|"$self") continue ;; esac
    if kill -9 "$p" 2>/dev/null; then found=1; fi
  done
  [ $found = 0 ] && break
done
echo '{"killed": true}'
