# Sourced by /init with the SMB share mounted on /mnt (aq.fs=cifs). Exercises the kernel
# SMB 3.1.1 client against the server, one AQ-CHECK line per check (checklib.sh). Between
# the two phases it prints "AQ-WAIT restart" and blocks until a line arrives on the console:
# the host restarts the server meanwhile, and the client has to reconnect, set its session
# up again and reopen the file it holds open. tests/smb_kernel.rs asserts every line and
# then reads the files back through REST. The host puts kc/from-host.bin there first.
#
# Not checked, as this client cannot do them over SMB 3 without POSIX extensions: hard
# links (the server does not implement FileLinkInformation), chmod and chown (modes and
# owners are synthesised by the client). Symbolic links are mfsymlinks files.

. /guest/checklib.sh

cd /mnt/kc || { fail cd "no /mnt/kc"; return; }
start=$(cut -d' ' -f1 /proc/uptime)

. /guest/file-checks.sh

# Appending, truncation through an open descriptor, a case-only rename (the namespace is
# case-sensitive), unlink of a file still open here.
drop_caches
expect append_content "hello-from-guest
appended" cat renamed.txt
run trunc_open sh -c 'echo 0123456789 >trunc-open.txt && exec 4<>trunc-open.txt && truncate -s 4 trunc-open.txt && echo tail >>trunc-open.txt'
drop_caches
expect trunc_open_content 0123tail cat trunc-open.txt
run rename_case mv renamed.txt Renamed.tmp
run rename_case_back mv Renamed.tmp renamed.txt
run unlink_open sh -c 'echo held >held.txt && exec 5<held.txt && rm held.txt && test "$(cat <&5)" = held'
drop_caches
refuse unlink_open_gone test -e held.txt

# A user other than the administrator copies a read-only file: the client creates it with
# FILE_ATTRIBUTE_READONLY (mode 0444 without POSIX extensions) and then writes its bytes
# through the handle that created it. The host made /alice, owned by her, and passes her
# account as this script's arguments.
mkdir -p /mnt2
run alice_mount mount -t cifs -o "vers=3.1.1,port=$port,username=$1,password=$2,ip=10.0.2.2,noperm,mfsymlinks,actimeo=0" "//10.0.2.2/$share" /mnt2
printf 'read-only source\n' >/tmp/ro-src && chmod 444 /tmp/ro-src
run ro_copy cp /tmp/ro-src /mnt2/alice/ro-copy.txt
drop_caches
expect ro_copy_content "read-only source" cat /mnt2/alice/ro-copy.txt
refuse ro_copy_reopened_to_write sh -c 'echo more >>/mnt2/alice/ro-copy.txt'
run alice_umount umount /mnt2

wait_for_restart

# After the restart the client reconnects and reopens what it holds.
expect restart_stat 26 stat -c %s renamed.txt
. /guest/restart-checks.sh
cd /
