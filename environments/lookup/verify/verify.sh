#!/bin/bash
# Reward 1 when the answer is this episode's code word (what `./lookup code` prints for the seed
# the reset wrote), else 0. Exact match after trimming: a list of words is not an answer. (Shell,
# as ./lookup: a Python start per episode was a third of the sandbox core's work in training.)
code=(amber birch cedar delta ember fjord grove harbor iris jade kelp lotus maple nectar onyx pearl quartz raven sable tulip)
hex=$(printf '%s' "$ENVKIT_SEED:code" | sha256sum)
expected=${code[$((16#${hex:0:15} % 20))]}
if [ -z "${ENVKIT_ANSWER+set}" ]; then
  echo '{"reward": 0.0, "answered": false}'
  exit 0
fi
answer=$ENVKIT_ANSWER
answer=${answer#"${answer%%[![:space:]]*}"}  # trim leading whitespace
answer=${answer%"${answer##*[![:space:]]}"}  # and trailing
if [ "$answer" = "$expected" ]; then reward=1.0; else reward=0.0; fi
echo "{\"reward\": $reward, \"answered\": true}"
