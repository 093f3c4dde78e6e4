# Sourced by the guest's check scripts (check.sh, cifs-check.sh): one line per check,
#   AQ-CHECK <name> ok
#   AQ-CHECK <name> FAIL <what happened>
# which the host test asserts (the names are the second word of each run/expect/refuse line,
# in the script and the files it sources from /guest).

ok() { echo "AQ-CHECK $1 ok"; }
fail() { name=$1; shift; echo "AQ-CHECK $name FAIL $*" | tr '\n' ' '; echo; }
# run NAME CMD...: the command must succeed.
run() {
    name=$1; shift
    if out=$("$@" 2>&1); then ok "$name"; else fail "$name" "rc=$? $out"; fi
}
# expect NAME WANT CMD...: the command must succeed and print exactly WANT.
expect() {
    name=$1 want=$2; shift 2
    got=$("$@" 2>&1); rc=$?
    if [ $rc -eq 0 ] && [ "$got" = "$want" ]; then ok "$name"; else fail "$name" "rc=$rc want [$want] got [$got]"; fi
}
# refuse NAME CMD...: the command must fail.
refuse() {
    name=$1; shift
    if out=$("$@" 2>&1); then fail "$name" "succeeded: $out"; else ok "$name"; fi
}
drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# The end of phase 1: opens open.txt on descriptor 3 (phase 2 writes through it after the
# restart), prints "AQ-WAIT restart" and blocks until the host, which restarts the server
# meanwhile, types a line on the console.
wait_for_restart() {
    exec 3>open.txt
    echo before-restart >&3
    run sync_before sync
    echo "AQ-PHASE1 $(cut -d' ' -f1 /proc/uptime) started=$start"
    echo "AQ-WAIT restart"
    read -r _go
    echo "AQ-RESUMED $(cut -d' ' -f1 /proc/uptime)"
}
