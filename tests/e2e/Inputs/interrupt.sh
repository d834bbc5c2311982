#!/bin/sh
# usage: interrupt.sh LOG COMMAND...
#
# Runs COMMAND (a long `moe-run train`) in the background with its stderr in LOG, waits for its
# first progress line (by then moe-run handles SIGINT), lets it train about a second more, sends
# SIGINT (Ctrl-C), waits for it and prints "exit status N". Never hangs: COMMAND runs under
# `timeout`, which passes the SIGINT on and SIGKILLs it (status 137) after 120 s; without a
# first progress line the script gives up after 60 s.
log=$1
shift
timeout -s KILL 120 "$@" 2> "$log" &
pid=$!
tries=0
until grep -q '^step 1/' "$log"; do
  tries=$((tries + 1))
  if grep -q 'error' "$log" || ! kill -0 "$pid" 2> /dev/null || [ "$tries" -gt 600 ]; then
    kill -KILL "$pid" 2> /dev/null
    wait "$pid"
    echo "no first step (status $?):"
    cat "$log"
    exit 1
  fi
  sleep 0.1
done
sleep 1
kill -INT "$pid"
wait "$pid"
echo "exit status $?"
