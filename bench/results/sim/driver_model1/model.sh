#!/bin/bash
# usage: model.sh ROUNDS "name:ENV=V,ENV=V ..." -- osu args
rounds=$1; shift; variants=$1; shift
for r in $(seq $rounds); do
  for v in $variants; do
    name=${v%%:*}; envs=${v#*:}
    env GPULMT_SIM_COPY=inline:3800 GPULMT_SIM_DRIVER_NS=1600,1400,150 ${envs//,/ } target/release/gpulmt-run -n 2 -- "$@" 2>/dev/null | grep -E "^[0-9]" | awk -v n=$name -v r=$r '{print n","r","$1","$2}'
  done
done
