# Sourced by /init with /mnt mounted. Exercises the kernel NFS client against the server and
# reports one line per check:
#   AQ-CHECK <name> ok
#   AQ-CHECK <name> FAIL <what happened>
# Between the two phases it prints "AQ-WAIT restart" and blocks until a line arrives on the
# console: the host restarts the server meanwhile, and phase 2 goes on with file handles and
# an open file descriptor obtained before the restart. tests/nfs_kernel.rs asserts every line
# and then reads the files back through REST. The host puts kc/from-host.bin there first.

. /guest/checklib.sh

cd /mnt/kc || { fail cd "no /mnt/kc"; return; }
start=$(cut -d' ' -f1 /proc/uptime)

. /guest/file-checks.sh

# Hard links.
run link ln renamed.txt d1/hardlink.txt
expect link_count 2 stat -c %h renamed.txt
expect link_same_inode "$(stat -c %i renamed.txt)" stat -c %i d1/hardlink.txt

# Removal of one of two links.
run unlink_link_prepare ln seq.txt seq-link.txt
expect unlink_link_prepare_count 2 stat -c %h seq.txt
run unlink_one_link rm seq-link.txt
drop_caches
expect unlink_link_count 1 stat -c %h seq.txt

# Attributes.
run chmod chmod 0640 renamed.txt
expect chmod_mode 640 stat -c %a renamed.txt

wait_for_restart

# After the restart: handles the client already holds must still work (no ESTALE).
expect restart_stat_old_handle 640 stat -c %a renamed.txt
# open() revalidates the cached inode with GETATTR on the handle from before the restart.
expect restart_read_old "hello-from-guest
appended" cat renamed.txt
. /guest/restart-checks.sh
cd /
