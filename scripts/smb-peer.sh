# Sourced by scripts/smbtorture.sh and scripts/bench-smb.sh: stock Samba smbd with a minimal
# standalone configuration (TESTING.md, SMB), every piece of its state under one directory.
#
#   start_samba DIR PORT PASSWORD [LINE]   shares DIR/share as "aquifer" to root with PASSWORD
#                                   on 127.0.0.1:PORT, appends smbd's pid to the caller's
#                                   `pids`; LINE is one more [global] setting (e.g.
#                                   "server signing = mandatory")
start_samba() {
    local dir=$1 port=$2 password=$3 extra=${4:-}
    mkdir -p "$dir/"{private,lock,state,cache,pid,ncalrpc,share}
    cat > "$dir/smb.conf" <<CONF
[global]
    server role = standalone server
    smb ports = $port
    interfaces = lo
    bind interfaces only = yes
    disable netbios = yes
    private dir = $dir/private
    lock directory = $dir/lock
    state directory = $dir/state
    cache directory = $dir/cache
    pid directory = $dir/pid
    ncalrpc dir = $dir/ncalrpc
    log file = $dir/log.%m
    passdb backend = tdbsam
    map to guest = never
    server min protocol = SMB2_02
    $extra
[aquifer]
    path = $dir/share
    read only = no
CONF
    printf '%s\n%s\n' "$password" "$password" | smbpasswd -c "$dir/smb.conf" -s -a root >/dev/null
    # Its own session: smbd signals its whole process group when it stops, which would
    # otherwise include the calling script.
    setsid smbd -s "$dir/smb.conf" --foreground --no-process-group > "$dir/smbd.out" 2>&1 &
    pids+=($!)
}
